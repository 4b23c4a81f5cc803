"""Distributed worker benchmark: one process against two ranks of MLX's ring backend on loopback.

Configurations (one running at a time, started afresh each round in a rotating order, so repeats
interleave and a noisy neighbour hits every one alike), each with and without the MTP head:
  - `one`: the native worker, one process;
  - `tensor`: two ranks, every layer split (mlx-lm's `shard`);
  - `pipeline`: two ranks, each a run of layers (mlx-lm's `pipeline`).

Measured: decode throughput (completion tokens over wall time, end to end) at width 1 (one
request) and width 4 (four at once), median and min-max over repeats after discarded warm-up
rounds (and one short discarded request per start), and each configuration's ratio to `one` with the same head setting. Greedy texts are
compared with `one`'s: pipeline must match it token for token; tensor adds its partial sums in
another order, so a near-tie may break differently (a note says where).

On one machine over loopback the two ranks share its cores and memory bandwidth, so this is a
floor on what the ranks' exchanges cost, not a speed claim for a Thunderbolt ring.

    python bench/scripts/distributed_bench.py --out bench-distributed.json   # the demo pair, target widened
    python bench/scripts/distributed_bench.py --target DIR --drafter DIR

Raw samples and summaries go to stdout (or --out) as JSON; a readable table to stderr.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtpstack.bench.parts import PROMPTS, check_models, emit, ensure_preload, model_options, prepare_models

#: Configuration -> (strategy, or None for one process; with the head).
CONFIGS = {
    "one+mtp": (None, True),
    "one": (None, False),
    "tensor+mtp": ("tensor", True),
    "tensor": ("tensor", False),
    "pipeline+mtp": ("pipeline", True),
    "pipeline": ("pipeline", False),
}
WIDTHS = (1, 4)
REQUEST_TIMEOUT = 600.0
START_TIMEOUT = 300.0


# -- pure parts (tested in tests/bench/test_distributed_bench_format.py) --------------------


def summarize(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    from mtpstack.bench.stats import summarize as stats

    s = stats(values)
    return {"median": s.median, "min": s.min, "max": s.max, "n": s.n}


def fmt(s: dict) -> str:
    if s.get("median") is None:
        return "n/a"
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f}, n={s['n']})"


def baseline_of(name: str) -> str:
    """The one-process configuration a configuration is compared with: same head setting."""
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


def report_lines(summary: dict, rel: dict, notes: list[str]) -> list[str]:
    widths = sorted({w for by_width in summary.values() for w in by_width}, key=int)
    lines = ["tok/s, median (min-max, n); x: over one process with the same head setting"]
    for name, by_width in summary.items():
        cells = []
        for w in widths:
            r = rel.get(name, {}).get(w)
            cells.append(f"width {w}: {fmt(by_width.get(w, {}))}" + (f" {r:.2f}x" if r is not None and not name.startswith("one") else ""))
        lines.append(f"  {name:<13} " + "; ".join(cells))
    return lines + [f"note: {n}" for n in notes]


# -- running -------------------------------------------------------------------------------


class Server:
    """One configuration's processes (one, or one per rank), started as `mtpstack up` starts them."""

    def __init__(self, name: str, target: Path, head: Path, depth: int, logdir: Path):
        from mtpstack.runtime import Process, free_port, free_port_run, url_of
        from mtpstack.validator import FleetConfig, rank_peers, worker_argv
        from mtpstack.worker.launcher import rank_environments, resolve_command, worker_env

        strategy, with_head = CONFIGS[name]
        port = free_port()
        worker = {
            "model": "bench", "target": {"path": str(target), "bits": "fp32"}, "maxNumSeqs": max(WIDTHS), "port": port,
            "drafter": {"path": str(head), "bits": "fp32", "depth": depth, "kind": "mtp"} if with_head else None,
            # A distributed worker keeps no prefix cache: none here either, so every round prefills alike.
            "prefixCache": {"maxGiB": 0},
        }
        hosts = {"r0": {"address": "127.0.0.1"}, "r1": {"address": "127.0.0.1"}}
        if strategy is not None:
            worker["distributed"] = {"hosts": list(hosts), "strategy": strategy, "basePort": free_port_run(len(hosts))}
        fleet = FleetConfig.model_validate({"proxy": {"concurrencyLimit": max(WIDTHS), "deployOn": "r0"}, "hosts": hosts,
                                            "workers": {"w": worker}})
        argv = resolve_command(worker_argv(fleet.workers["w"]))
        envs = [{}] if strategy is None else rank_environments(rank_peers(fleet, "w"), "ring", logdir / f"hostfile-{name}.json")
        self.url = url_of("127.0.0.1", port)
        self.procs = [Process(argv, log_path=logdir / f"{name}-rank{r}.log", name=f"{name}/{r}", kind="worker", url=self.url,
                              env=worker_env({**os.environ, **env})) for r, env in enumerate(envs)]

    def start(self) -> "Server":
        for p in reversed(self.procs):
            p.start()
        return self

    def wait(self) -> None:
        self.procs[0].wait_ready("/health", START_TIMEOUT, state="healthy")

    def stop(self) -> None:
        for p in self.procs:
            p.stop(timeout=10)


def complete(url: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:
        answer = json.loads(resp.read())
    return {"text": answer["choices"][0]["text"], "tokens": answer["usage"]["completion_tokens"]}


def measure(url: str, width: int, max_tokens: int, rnd: int) -> tuple[float, list[str]]:
    """(tok/s over `width` requests at once, their texts)."""
    prompts = [PROMPTS[(rnd + i) % len(PROMPTS)] for i in range(width)]
    start = time.perf_counter()
    with ThreadPoolExecutor(width) as pool:
        answers = list(pool.map(lambda p: complete(url, p, max_tokens), prompts))
    elapsed = time.perf_counter() - start
    return sum(a["tokens"] for a in answers) / elapsed, [a["text"] for a in answers]


def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="distributed-bench-"))
    target, head, source = prepare_models(args, workdir)
    print(f"models: {source}\n  target {target}\n  head {head}", file=sys.stderr)
    samples: dict = {name: {str(w): [] for w in WIDTHS} for name in args.configs}
    notes: list[str] = []
    for rnd in range(args.warmup + args.repeats):
        keep = rnd >= args.warmup
        texts: dict = {w: {} for w in WIDTHS}
        # One configuration runs at a time (idle ranks poll inside their collectives and would tax
        # the one measured); the order rotates each round so drift on a shared machine spreads out.
        order = args.configs[rnd % len(args.configs):] + args.configs[:rnd % len(args.configs)]
        for name in order:
            server = Server(name, target, head, args.depth, workdir).start()
            try:
                server.wait()
                measure(server.url, max(WIDTHS), 4, rnd)  # discarded: the first forwards of a fresh process
                for width in WIDTHS:
                    tok_s, texts[width][name] = measure(server.url, width, args.max_tokens, rnd)
                    if keep:
                        samples[name][str(width)].append(tok_s)
            finally:
                server.stop()
        for width, by_name in texts.items():
            for name, t in by_name.items():
                one = by_name.get(baseline_of(name))
                if one is not None and t != one:
                    notes.append(f"round {rnd}, width {width}: `{name}` greedy text differs from `{baseline_of(name)}`'s")
        print(f"round {rnd + 1}/{args.warmup + args.repeats} done" + ("" if keep else " (warm-up, discarded)"), file=sys.stderr)
    summary = {name: {w: summarize(v) for w, v in by_width.items()} for name, by_width in samples.items()}
    if args.repeats < 5:
        notes.append(f"only {args.repeats} repeats on a shared machine: treat ratios within ~10% as noise; rerun with --repeats 5 or more")
    import mlx.core as mx
    import mlx_lm

    return {
        "meta": {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "models": source, "target": str(target), "head": str(head), "depth": args.depth, "max_tokens": args.max_tokens,
            "repeats": args.repeats, "warmup": args.warmup, "transport": "ring backend over loopback, 2 ranks on one machine",
            "machine": platform.machine(), "cpus": os.cpu_count(), "ld_preload": os.environ.get("LD_PRELOAD"),
            "versions": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__},
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "summary": {"tok_s": summary, "ratio": ratios(summary), "notes": notes},
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_options(p, depth_help="draft depth with the head")
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="configurations (default: all)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default: 64)")
    p.add_argument("--repeats", type=int, default=5, help="measured rounds (default: 5)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default: 1)")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    args = p.parse_args(argv)
    check_models(p, args)
    ensure_preload()  # the same BLAS the servers get, for this process's own mlx (the widening)
    # A stop signal unwinds like Ctrl-C, so every server started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(args)
    lines = report_lines(result["summary"]["tok_s"], result["summary"]["ratio"], result["summary"]["notes"])
    return emit(result, lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
