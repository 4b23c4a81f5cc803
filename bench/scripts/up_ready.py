"""How long `mtpstack up` takes to be ready with one demo pair against another, runs interleaved.

Each run writes the bundled demo fleet with one pair's target and head (a folder holding `target/` and `mtp/`, as
worker/demo/models does), times `mtpstack up FLEET` from launch to the proxy's `/readyz` answering 200, and stops it
(SIGINT, as Ctrl-C). The pairs take turns in rotating order, so a busy machine slows both alike:

    python bench/scripts/up_ready.py --pair old=/tmp/old-models --pair new=worker/demo/models --rounds 8 --out ready.json

Prints each pair's median (min-max) seconds and the ratio of medians to the first pair's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from mtpstack.bench.parts import emit, fmt, rotated, spread
from mtpstack.runtime import Process, free_port, http_status, url_of
from mtpstack.up import default_fleet


def fleet_for(models: Path) -> dict:
    config = default_fleet()
    config["proxy"]["port"] = free_port()
    [worker] = config["workers"].values()
    worker["port"] = free_port()
    worker["target"]["path"] = str((models / "target").resolve())
    worker["drafter"]["path"] = str((models / "mtp").resolve())
    return config


def one_run(models: Path, work: Path, timeout: float) -> float:
    config = fleet_for(models)
    fleet = work / "fleet.json"
    fleet.write_text(json.dumps(config))
    ready = url_of(config["proxy"].get("host", "127.0.0.1"), config["proxy"]["port"]) + "/readyz"
    up = Process([sys.executable, "-m", "mtpstack", "up", str(fleet), "--run-dir", str(work / "run")],
                 log_path=work / "up.log", name=models.name, kind="up")
    started = time.perf_counter()
    up.start()
    try:
        while http_status(ready)[0] != 200:
            if not up.alive():
                raise SystemExit(f"error: `mtpstack up` with `{models}` exited before it was ready:\n{up.log_text()}")
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"error: `mtpstack up` with `{models}` not ready after {timeout:.0f} s:\n{up.log_text()}")
            time.sleep(0.05)
        return time.perf_counter() - started
    finally:
        up.interrupt()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", action="append", required=True, metavar="NAME=MODELS",
                   help="a pair to time: MODELS holds target/ and mtp/ (give two or more)")
    p.add_argument("--rounds", type=int, default=8, help="runs per pair (default: 8)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one run may take to be ready (default: 300)")
    p.add_argument("--out", help="write the JSON (every run) here instead of stdout")
    args = p.parse_args(argv)
    pairs = []
    for spec in args.pair:
        name, sep, path = spec.partition("=")
        models = Path(path)
        if not sep or not name or not (models / "target").is_dir() or not (models / "mtp").is_dir():
            p.error(f"--pair {spec!r}: expected NAME=MODELS, with MODELS/target and MODELS/mtp folders")
        pairs.append((name, models))
    if len(pairs) < 2:
        p.error("give at least two --pair options: the point is the comparison")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="up-ready-") as tmp:
        for i in range(args.rounds):
            for name, models in rotated(pairs, i):
                work = Path(tmp) / f"{name}-{i}"
                work.mkdir()
                seconds = one_run(models, work, args.timeout)
                runs.append({"pair": name, "round": i, "seconds": seconds})
                print(f"round {i + 1}/{args.rounds} {name}: ready in {seconds:.2f} s", file=sys.stderr)
    ready = {name: spread([r["seconds"] for r in runs if r["pair"] == name]) for name, _ in pairs}
    base = ready[pairs[0][0]]["median"]
    lines = [f"{name}\t{fmt(s, ' s')}\tratio {s['median'] / base:.2f}" for name, s in ready.items()]
    return emit({"runs": runs, "ready_s": ready}, lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
