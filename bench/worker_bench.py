"""Worker benchmark: the native worker side by side with `mlx_lm.server`, same models, one run.

Measures, with medians and min-max over repeats (after discarded warm-up rounds):
  1. single-stream throughput (tok/s, end to end) of each server, with and without the drafter;
  2. the drafter's speedup over no drafter, natively and in mlx-lm's own `stream_generate`;
  3. 4 concurrent clients at maxNumSeqs 4: time to first token and aggregate tok/s.

Every server is started through `worker.launcher` from `validator.worker_argv`, as
`mtpstack up` does, and all of them run at once (idle between measurements) so the
repeats interleave and a noisy neighbour hits every configuration alike.

    python bench/worker_bench.py --out bench-worker.json          # the demo pair, widened if possible
    python bench/worker_bench.py --target DIR --drafter DIR       # any local pair

Raw samples and summaries go to stdout (or --out) as JSON; a readable table to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PROMPTS = [
    "def parse_args(argv):\n",
    "The GNU General Public License is",
    "import os\nimport sys\n\n\ndef main():\n",
    "This program is free software; you can",
]
#: Bounds every HTTP exchange; a stuck server fails the run instead of hanging it.
REQUEST_TIMEOUT = 600


# -- pure summaries (unit-testable) ------------------------------------------------------


def summarize(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s: dict, unit: str = "", digits: int = 2) -> str:
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f}, n={s['n']})"


def ratio(a: dict, b: dict) -> float | None:
    if not a.get("median") or not b.get("median"):
        return None
    return a["median"] / b["median"]


def report_lines(summary: dict) -> list[str]:
    lines = ["single stream, end-to-end tok/s (median (min-max, n)):"]
    for name, s in summary["single"].items():
        lines.append(f"  {name:<22} {fmt(s['tok_s'])}   ttft {fmt(s['ttft_s'], ' s', 3)}")
    lines.append("drafter speedup over no drafter (ratio of medians):")
    for name, value in summary["speedup"].items():
        lines.append(f"  {name:<22} {value:.3f}x" if value else f"  {name:<22} n/a")
    if summary.get("speedup_share") is not None:
        lines.append(f"  native / stream_generate speedup: {summary['speedup_share']:.3f} (goal >= 0.95)")
    lines.append("4 concurrent clients, maxNumSeqs 4:")
    for name, s in summary["concurrent"].items():
        lines.append(
            f"  {name:<22} aggregate {fmt(s['aggregate_tok_s'])} tok/s   "
            f"ttft median {fmt(s['ttft_median_s'], ' s', 3)}   ttft max {fmt(s['ttft_max_s'], ' s', 3)}"
        )
    for note in summary.get("notes", []):
        lines.append(f"note: {note}")
    return lines


# -- models --------------------------------------------------------------------------------


def prepare_models(args, workdir: Path) -> tuple[Path, Path, str]:
    if args.target:
        return Path(args.target), Path(args.drafter), "given on the command line"
    from worker.demo import DEMO_DRAFTER, DEMO_TARGET

    if (DEMO_TARGET / "config.json").exists() and (DEMO_DRAFTER / "config.json").exists():
        try:
            from worker.demo import widen  # noqa: F401
        except ImportError:
            return DEMO_TARGET, DEMO_DRAFTER, "the trained demo pair (not widened: worker.demo.widen is missing)"
        out = widen_target(DEMO_TARGET, workdir / "wide-target", args)
        return out, DEMO_DRAFTER, (f"the demo pair, target widened by worker.demo.widen "
                                   f"(mlp x{args.mlp_multiplier}, +{args.extra_layers} zero layers)")
    from worker.demo.tiny import build_tiny_pair

    t, d = build_tiny_pair(workdir / "tiny")
    return t, d, "a random tiny pair (no trained demo models in the checkout)"


def widen_target(src: Path, dest: Path, args) -> Path:
    from worker.demo.widen import widen

    return Path(widen(src, dest, mlp_multiplier=args.mlp_multiplier, extra_layers=args.extra_layers))


# -- servers -------------------------------------------------------------------------------


def start_servers(target: Path, drafter: Path, depth: int, logdir: Path) -> dict:
    from validator import WorkerProfile, worker_argv
    from worker.launcher import resolve_command, worker_env
    from worker.process import WorkerProcess
    from worker.proof import free_port

    specs = {
        "native+drafter": ("native", True),
        "native": ("native", False),
        "native+drafter unbatched": ("native", True),
        "mlx_lm.server+drafter": ("mlx-lm", True),
        "mlx_lm.server": ("mlx-lm", False),
    }
    servers = {}
    env = worker_env()
    # mlx_lm.server answers /v1/models with an empty body when no HF cache dir exists.
    hf_cache = logdir / "hf-cache"
    hf_cache.mkdir(exist_ok=True)
    env.setdefault("HF_HUB_CACHE", str(hf_cache))
    for name, (backend, with_drafter) in specs.items():
        port = free_port()
        profile = WorkerProfile.model_validate({
            "model": "bench", "backend": backend,
            "target": {"path": str(target), "bits": "fp32"},
            "drafter": {"path": str(drafter), "bits": "fp32", "depth": depth} if with_drafter else None,
            "maxNumSeqs": 4, "port": port,
            "extraArgs": ["--batching", "off"] if name.endswith("unbatched") else [],
        })
        proc = WorkerProcess(resolve_command(worker_argv(profile)), host="127.0.0.1", port=port,
                             log_path=logdir / f"{name}.log", name=name, env=env)
        servers[name] = proc
    try:
        for proc in servers.values():
            proc.start()
        for proc in servers.values():
            proc.wait_healthy(timeout=300)
    except Exception:
        for proc in servers.values():
            proc.stop()
        raise
    return servers


async def stream_one(session, url: str, prompt: str, max_tokens: int, native: bool) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if native:
        body["model"] = "bench"
    start = time.perf_counter()
    first = None
    text, usage = [], None
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            payload = json.loads(line[6:])
            if payload.get("usage"):
                usage = payload["usage"]
            for choice in payload.get("choices") or []:
                if choice.get("text"):
                    first = first or time.perf_counter()
                    text.append(choice["text"])
    end = time.perf_counter()
    tokens = (usage or {}).get("completion_tokens") or 0
    return {"ttft_s": (first or end) - start, "total_s": end - start, "tokens": tokens,
            "tok_s": tokens / (end - start) if end > start else 0.0, "text": "".join(text)}


async def concurrent(session, url: str, clients: int, max_tokens: int, native: bool) -> dict:
    start = time.perf_counter()
    runs = await asyncio.gather(*(stream_one(session, url, PROMPTS[i % len(PROMPTS)], max_tokens, native)
                                  for i in range(clients)))
    wall = time.perf_counter() - start
    ttfts = [r["ttft_s"] for r in runs]
    return {"aggregate_tok_s": sum(r["tokens"] for r in runs) / wall, "ttft_median_s": statistics.median(ttfts),
            "ttft_max_s": max(ttfts), "wall_s": wall, "tokens": [r["tokens"] for r in runs]}


def stream_generate_run(model, draft, tokenizer, prompt: str, max_tokens: int, depth: int) -> dict:
    from mlx_lm.generate import stream_generate

    start = time.perf_counter()
    first, n, text = None, 0, []
    kw = {"draft_model": draft, "num_draft_tokens": depth} if draft is not None else {}
    for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, **kw):
        first = first or time.perf_counter()
        n = r.generation_tokens
        text.append(r.text)
    end = time.perf_counter()
    return {"ttft_s": (first or end) - start, "total_s": end - start, "tokens": n, "tok_s": n / (end - start),
            "text": "".join(text)}


# -- main ----------------------------------------------------------------------------------


def ensure_preload() -> None:
    """Re-exec under `worker_env()` so the in-process mlx-lm runs with the same BLAS as the servers."""
    from worker.launcher import worker_env

    env = worker_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", "") and not os.environ.get("_MTPSTACK_BENCH_REEXEC"):
        env["_MTPSTACK_BENCH_REEXEC"] = "1"
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


async def run(args) -> dict:
    import aiohttp
    import mlx_lm

    workdir = Path(tempfile.mkdtemp(prefix="worker-bench-"))
    target, drafter, source = prepare_models(args, workdir)
    print(f"models: {source}\n  target {target}\n  drafter {drafter}", file=sys.stderr)
    samples: dict = {"single": {}, "concurrent": {}}
    notes = []

    model, tokenizer = mlx_lm.load(str(target))
    draft, _ = mlx_lm.load(str(drafter))
    servers = start_servers(target, drafter, args.depth, workdir)
    try:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for rnd in range(args.warmup + args.repeats):
                keep = rnd >= args.warmup
                prompt = PROMPTS[rnd % len(PROMPTS)]
                texts = {}
                for name, proc in servers.items():
                    if name.endswith("unbatched"):
                        continue  # same as native+drafter for one stream
                    r = await stream_one(session, proc.url, prompt, args.max_tokens, name.startswith("native"))
                    texts[name] = r.pop("text")
                    if keep:
                        samples["single"].setdefault(name, []).append(r)
                for name, d in (("stream_generate+drafter", draft), ("stream_generate", None)):
                    r = stream_generate_run(model, d, tokenizer, prompt, args.max_tokens, args.depth)
                    texts[name] = r.pop("text")
                    if keep:
                        samples["single"].setdefault(name, []).append(r)
                if len(set(texts.values())) != 1:
                    notes.append(f"round {rnd}: greedy texts differ between configurations: "
                                 + ", ".join(f"{k}={len(v)} chars" for k, v in texts.items()))
                for name in servers:
                    c = await concurrent(session, servers[name].url, 4, args.max_tokens, name.startswith("native"))
                    if keep:
                        samples["concurrent"].setdefault(name, []).append(c)
                print(f"round {rnd + 1}/{args.warmup + args.repeats} done" + ("" if keep else " (warm-up, discarded)"),
                      file=sys.stderr)
    finally:
        for proc in servers.values():
            proc.stop()

    single = {name: {k: summarize([r[k] for r in rs]) for k in ("tok_s", "ttft_s")} for name, rs in samples["single"].items()}
    conc = {name: {k: summarize([r[k] for r in rs]) for k in ("aggregate_tok_s", "ttft_median_s", "ttft_max_s")}
            for name, rs in samples["concurrent"].items()}
    speedup = {
        "native": ratio(single["native+drafter"]["tok_s"], single["native"]["tok_s"]),
        "mlx_lm.server": ratio(single["mlx_lm.server+drafter"]["tok_s"], single["mlx_lm.server"]["tok_s"]),
        "stream_generate": ratio(single["stream_generate+drafter"]["tok_s"], single["stream_generate"]["tok_s"]),
    }
    share = speedup["native"] / speedup["stream_generate"] if speedup["native"] and speedup["stream_generate"] else None
    if args.repeats < 5:
        notes.append(f"only {args.repeats} repeats on a shared machine: treat ratios within ~10% as noise; rerun with --repeats 5 or more")
    import mlx.core as mx

    return {
        "meta": {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "models": source, "target": str(target), "drafter": str(drafter),
            "depth": args.depth, "max_tokens": args.max_tokens, "repeats": args.repeats, "warmup": args.warmup,
            "machine": platform.machine(), "cpus": os.cpu_count(), "ld_preload": os.environ.get("LD_PRELOAD"),
            "versions": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__},
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "summary": {"single": single, "speedup": speedup, "speedup_share": share, "concurrent": conc, "notes": notes},
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="target model directory (default: the demo pair, widened)")
    p.add_argument("--drafter", help="drafter model directory (with --target)")
    p.add_argument("--mlp-multiplier", type=int, default=8, help="widen: MLP width multiplier (default: 8)")
    p.add_argument("--extra-layers", type=int, default=10, help="widen: zero-output layers appended (default: 10)")
    p.add_argument("--depth", type=int, default=3, help="draft depth (default: 3)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default: 64)")
    p.add_argument("--repeats", type=int, default=3, help="measured rounds (default: 3)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default: 1)")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    args = p.parse_args(argv)
    if bool(args.target) != bool(args.drafter):
        p.error("--target and --drafter go together")
    ensure_preload()
    result = asyncio.run(run(args))
    print("\n".join(report_lines(result["summary"])), file=sys.stderr)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
