"""Distributed worker benchmark: one process against two ranks of MLX's ring backend on loopback.

Configurations, each with and without the MTP head, started afresh one at a time (idle ranks poll inside their
collectives and would tax the one measured) in an order rotated each round: `one`, the native worker in one
process; `tensor`, two ranks, every layer split (mlx-lm's `shard`); `pipeline`, two ranks, each a run of layers.
Measured: decode tok/s end to end at widths 1 and 4, median and min-max over rounds after discarded warm-up
rounds, and its ratio to `one` with the same head setting. Greedy texts must match `one`'s: pipeline token for
token; tensor sums its partials in another order, so a near-tie may break (a note says where). Both ranks share
one machine's cores: a floor on what their exchanges cost, not a speed claim for a Thunderbolt ring.

`--lose-rank`: how soon a distributed worker notices a lost rank instead. Two idle tensor ranks of the tiny
hybrid pair; rank 1 killed (`kill -9`) or hung (`kill -STOP`); the time until rank 0's `/health` stops
answering 200 and until it exits, median and min-max over `--repeats`.

    python bench/scripts/distributed_bench.py --out bench-distributed.json   # the demo pair, target widened
    python bench/scripts/distributed_bench.py --target DIR --drafter DIR
    python bench/scripts/distributed_bench.py --lose-rank --repeats 3
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import contextlib
import functools
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtpstack.bench import parts
from mtpstack.bench.parts import (PROMPTS, check_models, emit, ensure_preload, few_repeats, model_options, post_json,
                                  prepared_pair, round_options, rotated, rounds, run_meta, spread)
from mtpstack.bench.servers import REQUEST_TIMEOUT, worker_profile

#: Configuration (`one+mtp`, `one`, `tensor+mtp`, ...) -> (strategy, or None for one process; with the head).
CONFIGS = {f"{s}{mtp}": (None if s == "one" else s, bool(mtp))
           for s in ("one", "tensor", "pipeline") for mtp in ("+mtp", "")}
WIDTHS = (1, 4)
START_TIMEOUT = 300.0
#: `--lose-rank`: the signals that lose rank 1, and how long rank 0 sits idle, healthy, before it.
SIGNALS = {"kill -9": signal.SIGKILL, "kill -STOP": signal.SIGSTOP}
SETTLE_SECONDS = 2.0
fmt = functools.partial(parts.fmt, digits=1)


def baseline_of(name: str) -> str:
    """The one-process configuration with the same head setting."""
    return "one+mtp" if name.endswith("+mtp") else "one"


def ratios(summary: dict) -> dict:
    """Each configuration's median tok/s over its one-process baseline's, per width."""
    out: dict = {}
    for name, by_width in summary.items():
        base = summary.get(baseline_of(name), {})
        for width, s in by_width.items():
            b = base.get(width, {}).get("median")
            out.setdefault(name, {})[width] = s["median"] / b if b and s.get("median") is not None else None
    return out


def report_lines(tok_s: dict, ratio: dict, notes: list[str]) -> list[str]:
    widths = sorted({w for by_width in tok_s.values() for w in by_width}, key=int)
    lines = ["tok/s, median (min-max, n); x: over one process with the same head setting"]
    for name, by_width in tok_s.items():
        cells = []
        for w in widths:
            r = ratio.get(name, {}).get(w)
            cells.append(f"width {w}: {fmt(by_width.get(w, {}))}" + (f" {r:.2f}x" if r is not None and not name.startswith("one") else ""))
        lines.append(f"  {name:<13} " + "; ".join(cells))
    return lines + [f"note: {n}" for n in notes]


def loss_line(name: str, runs: list[dict]) -> str:
    u, e = (spread([r[key] for r in runs]) for key in ("unhealthy_s", "exited_s"))
    return (f"{name}: /health non-200 after {parts.fmt(u, ' s', count=False)}; rank 0 exited after "
            f"{parts.fmt(e, ' s', count=False)}, exit codes {sorted({r['exit_code'] for r in runs})}, n={u['n']}")


class Server:
    """A worker's processes (one, or two ranks on loopback) as `mtpstack up` starts them, for a `with` block."""

    def __init__(self, name: str, strategy: str | None, logdir: Path, target: Path, head: Path | None, depth: int,
                 width: int, **fields):
        from mtpstack.runtime import Process, free_port, free_port_run, url_of
        from mtpstack.validator import FleetConfig, rank_peers, worker_argv
        from mtpstack.worker.launcher import rank_environments, resolve_command, worker_env

        # A distributed worker keeps no prefix cache: none here either, so every round prefills alike.
        worker = worker_profile(target, head, depth, free_port(), width=width, prefixCache={"maxGiB": 0}, **fields)
        hosts = {"r0": {"address": "127.0.0.1"}, "r1": {"address": "127.0.0.1"}}
        if strategy is not None:
            worker = {**worker, "distributed": {"hosts": list(hosts), "strategy": strategy,
                                                "basePort": free_port_run(len(hosts))}}
        fleet = FleetConfig.model_validate({"proxy": {"concurrencyLimit": worker["maxNumSeqs"], "deployOn": "r0"},
                                            "hosts": hosts, "workers": {"w": worker}})
        argv = resolve_command(worker_argv(fleet.workers["w"]))
        envs = [{}] if strategy is None else rank_environments(rank_peers(fleet, "w"), "ring", logdir / f"hostfile-{name}.json")
        self.url = url_of("127.0.0.1", worker["port"])
        self.procs = [Process(argv, log_path=logdir / f"{name}-rank{r}.log", name=f"{name}/{r}", kind="worker", url=self.url,
                              env=worker_env({**os.environ, **env})) for r, env in enumerate(envs)]

    def __enter__(self) -> "Server":
        try:
            for p in reversed(self.procs):
                p.start()
        except BaseException:
            self.__exit__()  # rank 1 may be up already
            raise
        return self

    def wait(self, timeout: float = START_TIMEOUT) -> None:
        self.procs[0].wait_ready("/health", timeout, state="healthy")

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.signal(signal.SIGCONT)  # a rank hung by `--lose-rank` stops as any other
            p.stop(timeout=10)


def measure(url: str, width: int, max_tokens: int, rnd: int) -> tuple[float, list[str]]:
    """(tok/s over `width` requests at once, their texts)."""
    prompts = [PROMPTS[(rnd + i) % len(PROMPTS)] for i in range(width)]
    body = {"model": "bench", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    def complete(prompt: str) -> dict:
        return post_json(url, "/v1/completions", {**body, "prompt": prompt}, REQUEST_TIMEOUT)

    start = time.perf_counter()
    with ThreadPoolExecutor(width) as pool:
        answers = list(pool.map(complete, prompts))
    elapsed = time.perf_counter() - start
    return sum(a["usage"]["completion_tokens"] for a in answers) / elapsed, [a["choices"][0]["text"] for a in answers]


def run(args) -> dict:
    workdir, target, head, source = prepared_pair(args, "distributed-bench-")
    samples: dict = {name: {str(w): [] for w in WIDTHS} for name in CONFIGS}
    notes: list[str] = []
    for rnd, keep in rounds(args.warmup, args.repeats):
        texts: dict = {w: {} for w in WIDTHS}
        for name in rotated(list(CONFIGS), rnd):
            strategy, with_head = CONFIGS[name]
            drafter = head if with_head else None
            with Server(name, strategy, workdir, target, drafter, args.depth, max(WIDTHS)) as server:
                server.wait()
                measure(server.url, max(WIDTHS), 4, rnd)  # discarded: the first forwards of a fresh process
                for width in WIDTHS:
                    tok_s, texts[width][name] = measure(server.url, width, args.max_tokens, rnd)
                    if keep:
                        samples[name][str(width)].append(tok_s)
        for width, by_name in texts.items():
            for name, t in by_name.items():
                one = by_name.get(baseline_of(name))
                if one is not None and t != one:
                    notes.append(f"round {rnd}, width {width}: `{name}` greedy text differs from `{baseline_of(name)}`'s")
    summary = {name: {w: spread(v) for w, v in by_width.items()} for name, by_width in samples.items()}
    return {
        "meta": run_meta(models=source, target=str(target), head=str(head), depth=args.depth,
                         max_tokens=args.max_tokens, repeats=args.repeats, warmup=args.warmup,
                         transport="ring backend over loopback, 2 ranks on one machine"),
        "summary": {"tok_s": summary, "ratio": ratios(summary), "notes": notes + few_repeats(args.repeats)},
        "samples": samples,
    }


def lose_rank(target: Path, head: Path, sig: int, logdir: Path, n: int) -> dict:
    """Two idle ranks, rank 1 lost to `sig`: seconds until rank 0's `/health` is not 200 and until it exits."""
    from mtpstack.runtime import http_status

    with Server(f"loss{n}-{sig}", "tensor", logdir, target, head, 3, 2, model="tiny") as server:
        rank0, rank1 = server.procs
        server.wait(120)
        time.sleep(SETTLE_SECONDS)
        rank1.signal(sig)
        start = time.monotonic()
        while http_status(server.url + "/health", timeout=2)[0] == 200:
            time.sleep(0.05)
        unhealthy = time.monotonic() - start
        code = rank0.wait(timeout=60)
        return {"unhealthy_s": unhealthy, "exited_s": time.monotonic() - start, "exit_code": code}


def run_loss(args) -> int:
    from devkit.demo.tiny_hybrid import build_tiny_hybrid_pair

    workdir = Path(tempfile.mkdtemp(prefix="distributed-loss-"))
    target, head = build_tiny_hybrid_pair(workdir / "models", seed=0)
    runs = {name: [lose_rank(target, head, sig, workdir, n) for n in range(args.repeats)]
            for name, sig in SIGNALS.items()}
    report = {"meta": run_meta(settle_s=SETTLE_SECONDS), "runs": runs}
    return emit(report, [loss_line(name, r) for name, r in runs.items()], args.out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_options(p, depth_help="draft depth with the head")
    round_options(p, repeats=5)
    p.add_argument("--lose-rank", action="store_true", help="time how soon a lost rank is noticed instead (`--repeats` "
                   "runs per signal, on the tiny hybrid pair)")
    args = p.parse_args(argv)
    check_models(p, args)
    ensure_preload()  # the same BLAS the servers get, for this process's own mlx (the widening)
    # A stop signal unwinds like Ctrl-C, so every server started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.lose_rank:
        return run_loss(args)
    result = run(args)
    return emit(result, report_lines(**result["summary"]), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
