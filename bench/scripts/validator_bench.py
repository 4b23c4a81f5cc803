"""How long `validate` takes on large fleets: parse + model + rules, end to end from a YAML file.

    .venv/bin/python bench/scripts/validator_bench.py [--workers 1000] [--repeats 15] [--kind valid rules structure]

Prints the median (min-max) seconds over repeats, after one warm-up, per fleet size and kind. Kinds: `valid`;
`rules`, every worker's width disagreeing with its gate and every port taken twice (a finding per worker from the
rules); `structure`, a misspelled key in every worker (a finding per worker from the model, with its did-you-mean).
4,500 workers make a 1 MB file.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from mtpstack.bench.parts import emit, fmt, spread
from mtpstack.validator import load_config


def fleet(workers: int, kind: str = "valid") -> dict:
    models = [f"model-{i}" for i in range(max(1, workers // 10))]
    data = {
        "proxy": {"concurrencyLimit": 1, "modelConcurrencyLimits": {m: 1 + i % 4 for i, m in enumerate(models)}},
        "workers": {
            f"w{i}": {
                "model": models[i % len(models)],
                "target": {"path": f"/srv/models/{models[i % len(models)]}", "bits": 4},
                "drafter": {"path": f"/srv/models/{models[i % len(models)]}-mtp", "bits": 6, "depth": 3},
                "maxNumSeqs": 1 + (i % len(models)) % 4,
                "host": f"10.0.{i // 250}.{i % 250 + 1}",
                "port": 8101 + i % 50,
            }
            for i in range(workers)
        },
    }
    for w in data["workers"].values():
        if kind == "rules":
            w["maxNumSeqs"] = 1 + w["maxNumSeqs"] % 4
            w["host"] = "127.0.0.1"
        elif kind == "structure":
            w["maxNumSeq"] = w.pop("maxNumSeqs")
    return data


def measure(path: Path, repeats: int, kind: str) -> list[float]:
    load_config(path)  # warm-up: imports, pydantic schema build
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        config, report = load_config(path)
        times.append(time.perf_counter() - start)
        assert report.ok == (kind == "valid"), report.render_text()[:500]
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kind", nargs="+", choices=("valid", "rules", "structure"), default=["valid"])
    parser.add_argument("--out", help="write the JSON (every time) here instead of stdout")
    args = parser.parse_args(argv)
    fleets, lines = [], [f"{'workers':>8}  {'kind':>9}  {'bytes':>9}  seconds"]
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            for kind in args.kind:
                path = Path(tmp) / f"fleet-{n}-{kind}.yaml"
                path.write_text(yaml.safe_dump(fleet(n, kind)))
                times = measure(path, args.repeats, kind)
                fleets.append({"workers": n, "kind": kind, "bytes": path.stat().st_size, "seconds": times})
                lines.append(f"{n:>8}  {kind:>9}  {path.stat().st_size:>9}  {fmt(spread(times), ' s', 3)}")
    return emit({"fleets": fleets}, lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
