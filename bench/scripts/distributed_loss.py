"""How soon a distributed worker notices a lost rank: two ranks of the ring backend on loopback (the
tiny hybrid pair with its head), idle; rank 1 killed (`kill -9`) or hung (`kill -STOP`); the time
until rank 0's `/health` stops answering 200 and until rank 0 exits, median and min-max over repeats.

    python bench/scripts/distributed_loss.py --repeats 3

A JSON report to stdout (or --out), a readable line per signal to stderr.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from mtpstack.bench.parts import emit

SIGNALS = {"kill -9": signal.SIGKILL, "kill -STOP": signal.SIGSTOP}
#: How long rank 0 sits idle, healthy, before its peer is lost.
SETTLE_SECONDS = 2.0


def health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def line(name: str, runs: list[dict]) -> str:
    u, e = summarize([r["unhealthy_s"] for r in runs]), summarize([r["exited_s"] for r in runs])
    codes = sorted({r["exit_code"] for r in runs})
    return (f"{name}: /health non-200 after {u['median']:.2f} s ({u['min']:.2f}-{u['max']:.2f}); rank 0 exited after "
            f"{e['median']:.2f} s ({e['min']:.2f}-{e['max']:.2f}), exit codes {codes}, n={u['n']}")


def once(target: Path, head: Path, sig: int, logdir: Path) -> dict:
    from mtpstack.runtime import Process, free_port, free_port_run, url_of
    from mtpstack.validator import FleetConfig, rank_peers, worker_argv
    from mtpstack.worker.launcher import rank_environments, resolve_command, worker_env

    port = free_port()
    hosts = {"r0": {"address": "127.0.0.1"}, "r1": {"address": "127.0.0.1"}}
    fleet = FleetConfig.model_validate({"proxy": {"concurrencyLimit": 2, "deployOn": "r0"}, "hosts": hosts, "workers": {"w": {
        "model": "tiny", "target": {"path": str(target), "bits": "fp32"}, "maxNumSeqs": 2, "port": port,
        "drafter": {"path": str(head), "bits": "fp32", "depth": 3, "kind": "mtp"}, "prefixCache": {"maxGiB": 0},
        "distributed": {"hosts": list(hosts), "basePort": free_port_run(len(hosts))},
    }}})
    argv = resolve_command(worker_argv(fleet.workers["w"]))
    envs = rank_environments(rank_peers(fleet, "w"), "ring", logdir / f"hostfile-{port}.json")
    url = url_of("127.0.0.1", port)
    ranks = [Process(argv, log_path=logdir / f"rank{r}-{port}.log", name=f"rank{r}", kind="worker", url=url,
                     env=worker_env({**os.environ, **env})) for r, env in enumerate(envs)]
    for p in reversed(ranks):
        p.start()
    try:
        ranks[0].wait_ready("/health", 120, state="healthy")
        time.sleep(SETTLE_SECONDS)
        ranks[1].signal(sig)
        start = time.monotonic()
        while health(url) == 200:
            time.sleep(0.05)
        unhealthy = time.monotonic() - start
        code = ranks[0].wait(timeout=60)
        return {"unhealthy_s": unhealthy, "exited_s": time.monotonic() - start, "exit_code": code}
    finally:
        for p in ranks:
            try:
                p.signal(signal.SIGCONT)
            except Exception:
                pass
            p.stop(timeout=5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="runs per signal (default: 3)")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    args = p.parse_args(argv)
    from devkit.demo.tiny_hybrid import build_tiny_hybrid_pair

    workdir = Path(tempfile.mkdtemp(prefix="distributed-loss-"))
    target, head = build_tiny_hybrid_pair(workdir / "models", seed=0)
    runs = {name: [once(target, head, sig, workdir) for _ in range(args.repeats)] for name, sig in SIGNALS.items()}
    report = {"meta": {"command": " ".join([Path(sys.executable).name, *sys.argv]), "settle_s": SETTLE_SECONDS}, "runs": runs}
    return emit(report, [line(name, r) for name, r in runs.items()], args.out)


if __name__ == "__main__":
    raise SystemExit(main())
