"""Worker benchmark: the native worker serving an MTP head, side by side with its peers, same models, one run.

The configurations (`mtpstack.bench.servers.CONFIGS`) all run at once, idle between measurements, so rounds
interleave and a noisy neighbour hits every one alike. Medians and min-max over the kept rounds of single-stream
tok/s and time to first token (apart for prefix-cache hits), the head's speedup over no head and each drafted
configuration's step cost (decode time per step with the head over per token without it, same server, round by
round), and 4 concurrent clients' aggregate tok/s and TTFT. The method: docs/worker.md, "Benchmark".

    python bench/scripts/worker_bench.py --out bench-worker.json          # the demo pair, target widened
    python bench/scripts/worker_bench.py --target DIR --drafter DIR       # any local target + head
    python bench/scripts/worker_bench.py --family nemotron_h              # a tiny pair of another MTP family, widened
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import statistics
import time
from collections import defaultdict

from mtpstack import series
from mtpstack.bench.parts import (PROMPTS, check_models, emit, ensure_preload, few_repeats, fmt, model_options,
                                  prepared_pair, round_options, rounds, run_meta, spread)
from mtpstack.bench.servers import CONFIGS, REQUEST_TIMEOUT, WIDTH, served_model, start_servers, stream_chat
from mtpstack.bench.sweep import scrape
from mtpstack.validator import DEPTH_DEFAULT

#: A drafted configuration -> the same server without the head, its step cost's unit.
PLAIN_OF = {"native+mtp": "native", "native+mtp@baseline": "native", "mlx-vlm+mtp": "mlx-vlm"}
#: The native worker's counters read around a single stream: its exact steps and the seconds spent in them.
STEP_COUNTERS = (series.TARGET_STEPS, series.TARGET_STEP_SECONDS)


def single_summary(runs: list[dict]) -> dict:
    """tok/s; time to first token over all runs, and apart where the prefix cache held the prompt or not."""
    return {
        "tok_s": spread([r["tok_s"] for r in runs]),
        "ttft_s": spread([r["ttft_s"] for r in runs]),
        "ttft_cold_s": spread([r["ttft_s"] for r in runs if not r.get("cached_tokens")]),
        "ttft_hit_s": spread([r["ttft_s"] for r in runs if r.get("cached_tokens")]),
    }


def ratio(a: dict, b: dict) -> float | None:
    return a["median"] / b["median"] if a.get("median") and b.get("median") else None


def report_lines(summary: dict) -> list[str]:
    lines = ["single stream, end-to-end tok/s (median (min-max, n)):"]
    for name, s in summary["single"].items():
        lines.append(f"  {name:<22} {fmt(s['tok_s'])}   ttft {fmt(s['ttft_s'], ' s', 3)}")
        if s.get("ttft_hit_s", {}).get("n"):
            lines.append(f"  {'':<22} ttft prefilled whole {fmt(s['ttft_cold_s'], ' s', 3)}, "
                         f"from the prefix cache {fmt(s['ttft_hit_s'], ' s', 3)}")
    lines.append("the head's speedup over no head (ratio of medians):")
    lines += [f"  {name:<22} {value:.3f}x" if value else f"  {name:<22} n/a" for name, value in summary["speedup"].items()]
    steps = summary.get("step_costs") or {}
    if steps:
        lines.append("step cost, decode only (time per step with the head / per token without it, same server, "
                     "round by round):")
    for name, c in steps.items():
        lines.append(f"  {name:<22} {fmt(c['step_cost'])} plain steps ({fmt(c['step_ms'], ' ms', 1)} a step), "
                     f"{fmt(c['tokens_per_step'])} tokens per step: {fmt(c['speedup'], 'x', 3)}")
        if (c.get("step_ms_inside") or {}).get("n"):
            lines.append(f"  {'':<22} of which in the worker's step itself (its /metrics): "
                         f"{fmt(c['step_ms_inside'], ' ms', 1)}")
    if summary.get("acceptance") is not None:
        lines.append(f"  acceptance per drafted token (native+mtp's usage): {summary['acceptance']:.2f}")
    lines.append(f"{WIDTH} concurrent clients, maxNumSeqs {WIDTH}:")
    lines += [f"  {name:<22} aggregate {fmt(s['aggregate_tok_s'])} tok/s   ttft median {fmt(s['ttft_median_s'], ' s', 3)}"
              f"   ttft max {fmt(s['ttft_max_s'], ' s', 3)}" for name, s in summary["concurrent"].items()]
    lines += [f"  {label}: {value:.3f}" if value is not None else f"  {label}: n/a"
              for label, value in summary.get("goals", {}).items()]
    return lines + [f"note: {note}" for note in summary.get("notes", [])]


def default_configs(baseline: str | None) -> list[str]:
    """Every configuration; the baseline build's only when one is given."""
    return [name for name in CONFIGS if baseline or not name.endswith("@baseline")]


def decode_steps(usage: dict, timings: dict | None = None, counted: float | None = None) -> int | None:
    """Verify steps after an answer's first token: the native worker's `/metrics` count (`counted`), mlx-vlm's
    `timings.draft_rounds`, else the usage's (a step emits its accepted drafts and one token), which falls a step
    or two short where an answer ends at an end of turn the usage does not count (the worker's)."""
    if counted:
        return int(counted)
    if timings and timings.get("draft_rounds"):
        return int(timings["draft_rounds"])
    tokens = usage.get("completion_tokens") or 0
    steps = tokens - 1 - (usage.get("accepted_draft_tokens") or 0)
    return steps if steps > 0 else None


def step_costs(single: dict[str, list[dict]]) -> dict:
    """Per drafted configuration whose plain counterpart (`PLAIN_OF`) ran, round by round: decode seconds per
    step over the counterpart's per token, tokens per step, their ratio (the decode speedup), the step's ms."""
    out = {}
    for name, plain in PLAIN_OF.items():
        costs, per_step, ms, inside = [], [], [], []
        for r, b in zip(single.get(name, []), single.get(plain, [])):
            if r.get("steps") and b.get("steps") and r.get("decode_s") and b.get("decode_s"):
                costs.append((r["decode_s"] / r["steps"]) / (b["decode_s"] / b["steps"]))
                per_step.append((r.get("chosen", r["tokens"]) - 1) / r["steps"])
                ms.append(r["decode_s"] / r["steps"] * 1e3)
                if r.get("step_s"):
                    inside.append(r["step_s"] / r["steps"] * 1e3)
        if costs:
            out[name] = {"step_cost": spread(costs), "tokens_per_step": spread(per_step), "step_ms": spread(ms),
                         "speedup": spread([t / c for t, c in zip(per_step, costs)]),
                         "step_ms_inside": spread(inside)}
    return out


async def stream_one(session, url: str, prompt: str, max_tokens: int, model: str, ignore_eos: bool = True,
                     counters: bool = False) -> dict:
    """One stream timed end to end; `counters` (a native worker alone on it): its `STEP_COUNTERS` around it
    (`step_s` None from a build without the seconds counter)."""
    before = await scrape(session, url, STEP_COUNTERS) if counters else {}
    r = await stream_chat(session, url, model, [{"role": "user", "content": prompt}], max_tokens, ignore_eos=ignore_eos)
    after = await scrape(session, url, STEP_COUNTERS) if counters else {}
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    tokens = r["usage"].get("completion_tokens") or 0
    # The tokens the steps chose: the worker's usage leaves out the end of turn its last step chose
    # (a `stop`: the bench sends no stop strings), mlx-vlm's counts it; so tokens a step compare alike.
    chosen = tokens + (1 if counters and r["finish_reason"] == "stop" else 0)
    cached = (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    total = r["end"] - r["sent"]
    return {"ttft_s": r["ttft_s"], "total_s": total, "tokens": tokens, "cached_tokens": cached,
            "tok_s": tokens / total if total > 0 else 0.0, "text": r["text"],
            "decode_s": r["end"] - r["first"], "steps": decode_steps(r["usage"], r["timings"], delta.get(series.TARGET_STEPS)),
            "step_s": delta.get(series.TARGET_STEP_SECONDS), "chosen": chosen,
            "drafted": r["usage"].get("draft_tokens"), "accepted": r["usage"].get("accepted_draft_tokens")}


async def concurrent(session, url: str, clients: int, max_tokens: int, model: str, tag: str = "",
                     ignore_eos: bool = True) -> dict:
    """`clients` streams at once; `tag` (e.g. the round) begins every prompt, so no prefix cache holds them."""
    start = time.perf_counter()
    runs = await asyncio.gather(*(stream_one(session, url, f"{tag}{PROMPTS[i % len(PROMPTS)]}", max_tokens, model,
                                             ignore_eos) for i in range(clients)))
    wall = time.perf_counter() - start
    ttfts = [r["ttft_s"] for r in runs]
    return {"aggregate_tok_s": sum(r["tokens"] for r in runs) / wall, "ttft_median_s": statistics.median(ttfts),
            "ttft_max_s": max(ttfts), "wall_s": wall, "tokens": [r["tokens"] for r in runs]}


async def run(args) -> dict:
    import aiohttp

    workdir, target, head, source = prepared_pair(args, "worker-bench-")
    samples: dict = {"single": {}, "concurrent": {}}
    notes = []
    servers = start_servers(target, head, args.depth, workdir, args.configs, args.baseline)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as session:
            for rnd, keep in rounds(args.warmup, args.repeats):
                texts = {}
                for name, proc in servers.items():
                    r = await stream_one(session, proc.url, PROMPTS[rnd % len(PROMPTS)], args.max_tokens,
                                         served_model(name, target), not args.stop_at_end,
                                         counters=CONFIGS[name][0] == "native")
                    texts[name] = r.pop("text")
                    if keep:
                        samples["single"].setdefault(name, []).append(r)
                if len(set(texts.values())) != 1:
                    notes.append(f"round {rnd}: greedy texts differ between configurations: "
                                 + ", ".join(f"{k}={v[:40]!r}" for k, v in texts.items()))
                for name, proc in servers.items():
                    c = await concurrent(session, proc.url, WIDTH, args.max_tokens, served_model(name, target),
                                         f"# round {rnd}\n", not args.stop_at_end)
                    if keep:
                        samples["concurrent"].setdefault(name, []).append(c)
    finally:
        for proc in servers.values():
            proc.stop()
    return {"meta": run_meta(models=source, target=str(target), head=str(head), depth=args.depth,
                             max_tokens=args.max_tokens, stop_at_end=args.stop_at_end, repeats=args.repeats,
                             warmup=args.warmup),
            "summary": summary_of(samples, args.depth, notes + few_repeats(args.repeats)), "samples": samples}


def summary_of(samples: dict, depth: int, notes: list[str]) -> dict:
    """Every round's samples summarised: spreads, the head's speedups and step costs, acceptance, the goals."""
    single = {name: single_summary(rs) for name, rs in samples["single"].items()}
    conc = {name: {k: spread([r[k] for r in rs]) for k in ("aggregate_tok_s", "ttft_median_s", "ttft_max_s")}
            for name, rs in samples["concurrent"].items()}
    # The spreads a ratio divides, empty for a configuration not run.
    tok_s = defaultdict(dict, {name: s["tok_s"] for name, s in single.items()})
    aggregate = defaultdict(dict, {name: s["aggregate_tok_s"] for name, s in conc.items()})
    speedup = {"native": ratio(tok_s["native+mtp"], tok_s["native"]),
               "mlx-vlm": ratio(tok_s["mlx-vlm+mtp"], tok_s["mlx-vlm"])}
    costs = step_costs(samples["single"])
    mine = samples["single"].get("native+mtp", [])
    drafted = sum(r.get("drafted") or 0 for r in mine)
    goals = {
        "single stream: native+mtp / mlx-vlm+mtp (goal >= 1.15)": ratio(tok_s["native+mtp"], tok_s["mlx-vlm+mtp"]),
        "the head's speedup: native / mlx-vlm (goal >= 1)": (
            speedup["native"] / speedup["mlx-vlm"] if speedup["native"] and speedup["mlx-vlm"] else None),
        f"step cost at depth {depth}: native+mtp (goal <= 1.3)": (
            costs["native+mtp"]["step_cost"]["median"] if "native+mtp" in costs else None),
        f"aggregate at {WIDTH}: native+mtp / mlx-vlm+mtp (goal >= 1.3)": ratio(
            aggregate["native+mtp"], aggregate["mlx-vlm+mtp"]),
        f"aggregate at {WIDTH}: native+mtp / mlx_lm.server (goal >= 1)": ratio(
            aggregate["native+mtp"], aggregate["mlx_lm.server"]),
    }
    return {"single": single, "speedup": speedup, "step_costs": costs, "concurrent": conc, "goals": goals,
            "notes": notes, "acceptance": sum(r.get("accepted") or 0 for r in mine) / drafted if drafted else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_options(p, depth=DEPTH_DEFAULT)
    from devkit.demo.tiny_families import PAIRS

    p.add_argument("--family", choices=list(PAIRS), help="a tiny random pair of this MTP family, its target widened "
                   "(default: the demo pair); mlx-vlm 0.7.10 runs MTP for qwen3_5, qwen3_5_moe and nemotron_h only")
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS),
                   help="configurations to run (default: all; `native+mtp@baseline` only with --baseline)")
    round_options(p, repeats=3)
    p.add_argument("--stop-at-end", action="store_true", help="answers end at the end of turn on every server, as "
                   "the peers' always do (default: the native worker's run to --max-tokens): the same text everywhere")
    p.add_argument("--baseline", metavar="PROGRAM", help="another build's `mtpstack` executable, run as "
                   "`native+mtp@baseline`, so before and after a change are measured side by side")
    args = p.parse_args(argv)
    check_models(p, args)
    if args.family and args.target:
        p.error("--family builds its own pair: give it or --target/--drafter, not both")
    args.configs = args.configs or default_configs(args.baseline)
    ensure_preload()
    result = asyncio.run(run(args))
    return emit(result, report_lines(result["summary"]), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
