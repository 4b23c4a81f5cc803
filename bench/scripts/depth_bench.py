"""Adaptive draft depth against every fixed depth: does `auto` find the depth that pays, and never cost?

Per pair (the demo target widened, with its own head and with `devkit.demo.weak_head`'s head that pays little),
each configuration (fixed depths `--depths`, and `auto`) runs in a fresh worker of one profile (`drafter.depth:
auto`, `maxDepth` the deepest fixed depth; a fixed depth is a request's `num_draft_tokens`, so every process has
the same argv and its weights are proven from it), in an order rotated each round. Per width and workload: a
warm-up request, then a greedy pass of `--prompts` prompts, its tokens over its wall time; median (min-max) over
rounds, `auto`'s ratios to the best fixed depth and to depth 0, and the depths its steps ran at (docs/bench.md).
Writes DIR/results.json (every pass), DIR/report.md and DIR/depth.png (`auto` drawn at its mean depth).

    python bench/scripts/depth_bench.py --out bench-depth           # 2 pairs x 3 workloads x widths 1, 4
    python bench/scripts/depth_bench.py --rounds 3 --pairs demo-wide --widths 1
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import aiohttp

from mtpstack import series
from mtpstack.bench.parts import demo_pair, ensure_preload, fmt, rotated, spread
from mtpstack.bench.report import figure, save_figure
from mtpstack.bench.servers import metrics, worker_profile
from mtpstack.bench.sweep import (Expected, SweepError, check_weights, load_prompts, local_hash, parse_depths,
                                  parse_widths, run_pass, start_worker)
from mtpstack.proxy.prometheus import labelled
from mtpstack.runtime import free_port
from mtpstack.validator import WorkerProfile

AUTO = "auto"
WORKLOADS = ("code", "prose", "tool")
PAIRS = ("demo-wide", "weak-head")
#: The weak head's input-projection noise in standard deviations (acceptance ~0.25 at depth 3, trained 0.64).
WEAK_NOISE = 1.0
#: The warm-up request's length: enough to compile every step shape, short beside a measured pass.
WARMUP_TOKENS = 16


def prepare(workdir: Path, args) -> dict[str, tuple[Path, Path]]:
    from devkit.demo.weak_head import weaken_head

    target, head, _ = demo_pair(workdir, args.mlp_multiplier, args.extra_layers)
    weak = weaken_head(head, workdir / "weak-head", noise=WEAK_NOISE)
    pairs = {"demo-wide": (target, head), "weak-head": (target, weak)}
    return {name: pairs[name] for name in args.pairs}


def depth_steps(url: str) -> dict[str, float]:
    """The worker's steps so far by draft depth (read between passes, so the blocking read waits on nothing)."""
    return {labels["depth"]: value for labels, value in labelled(metrics(url), series.DRAFT_DEPTH_STEPS)}


async def measure(proc, config, prompts: dict, args) -> dict:
    """One process: per width and workload a warm-up request and a measured pass."""
    # `ignore_eos`: the demo target ends most answers within ten tokens; a pass of those would time prefill and HTTP.
    extra = {"ignore_eos": True, **({} if config == AUTO else {"num_draft_tokens": config})}
    out = {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for width in args.widths:
            for workload in args.workloads:
                await run_pass(session, proc.url, "bench", prompts[workload][:1], WARMUP_TOKENS, 1, extra)
                before = depth_steps(proc.url)
                p = await run_pass(session, proc.url, "bench", prompts[workload], args.max_tokens, width, extra)
                after = depth_steps(proc.url)
                steps = {d: after[d] - before.get(d, 0.0) for d in after if after[d] - before.get(d, 0.0) > 0}
                out[f"{workload}@{width}"] = {"tps": p["e2e_tps"], "acceptance": p["acceptance"], "steps_by_depth": steps,
                                              "outputs": [r["output_sha256"] for r in p["requests"]]}
    return out


def run_pair(name: str, target: Path, head: Path, args, logdir: Path) -> dict:
    prompts = {w: load_prompts(w)[: args.prompts] for w in args.workloads}
    configs = [*args.depths, AUTO]
    passes: dict[str, dict[str, list[dict]]] = {str(c): {} for c in configs}
    for r in range(args.rounds):
        for config in rotated(configs, r):
            profile = worker_profile(target, head, AUTO, free_port(), width=max(args.widths), host="127.0.0.1")
            profile["drafter"]["maxDepth"] = max(args.depths)
            profile = WorkerProfile.model_validate(profile)
            proc = start_worker(profile, logdir / f"{name}-{config}-{r}.log", f"{name} {config}")
            try:
                proc.wait_ready("/health", 600, state="healthy")
                check_weights(proc.pid, proc.url, Expected(profile, local_hash(str(target)), local_hash(str(head))))
                got = asyncio.run(measure(proc, config, prompts, args))
            finally:
                proc.stop()
            for key, value in got.items():
                passes[str(config)].setdefault(key, []).append(value)
            print(f"{name} round {r + 1} {config}: " + ", ".join(f"{k} {v['tps']:.1f}" for k, v in got.items()), file=sys.stderr)
    return passes


def summarize(passes: dict, depths: list[int]) -> dict:
    """Per workload and width: each configuration's spread, `auto`'s ratios and the depths its steps ran at."""
    out = {}
    for key in passes[AUTO]:
        cells = {c: spread([p["tps"] for p in passes[c][key]]) for c in passes}
        best = max((str(d) for d in depths), key=lambda d: cells[d]["median"])
        steps: Counter = Counter()
        for p in passes[AUTO][key]:
            steps.update(p["steps_by_depth"])
        total = sum(steps.values()) or 1.0
        out[key] = {
            "tps": cells, "best_fixed": int(best),
            "auto_over_best": cells[AUTO]["median"] / cells[best]["median"],
            "auto_over_depth0": cells[AUTO]["median"] / cells["0"]["median"] if "0" in cells else None,
            "auto_depths": {d: n / total for d, n in sorted(steps.items())},
            "auto_mean_depth": sum(int(d) * n for d, n in steps.items()) / total,
            # Greedy output is the target's at every depth: the same text per prompt in every configuration.
            "same_output": len({tuple(p["outputs"]) for c in passes for p in passes[c][key]}) == 1,
        }
    return out


def report_lines(results: dict) -> list[str]:
    lines = []
    for pair, summary in results["summary"].items():
        configs = list(next(iter(summary.values()))["tps"])
        lines += [f"## {pair}", "", "| workload @ width | " + " | ".join(f"depth {c}" if c != AUTO else "auto" for c in configs)
                  + " | auto / best fixed | auto / depth 0 | auto's depths (share of steps) | same output |",
                  "|---" * (len(configs) + 5) + "|"]
        for key, row in summary.items():
            depths = ", ".join(f"{d}: {share:.0%}" for d, share in row["auto_depths"].items())
            ratio0 = "-" if row["auto_over_depth0"] is None else f"{row['auto_over_depth0']:.2f}"
            lines.append(f"| {key} | " + " | ".join(fmt(row["tps"][c], digits=1, count=False) for c in configs)
                         + f" | {row['auto_over_best']:.2f} (best: {row['best_fixed']}) | {ratio0} | {depths} | {row['same_output']} |")
        lines.append("")
    return lines


def plot(results: dict, path: Path) -> Path:
    pairs = list(results["summary"])
    widths = sorted({int(k.split("@")[1]) for s in results["summary"].values() for k in s})
    fig, axes = figure(len(pairs), len(widths), figsize=(5 * len(widths), 3.6 * len(pairs)), squeeze=False)
    for i, pair in enumerate(pairs):
        for j, width in enumerate(widths):
            ax = axes[i][j]
            for key, row in results["summary"][pair].items():
                workload, w = key.split("@")
                if int(w) != width:
                    continue
                fixed = sorted((int(c), s["median"]) for c, s in row["tps"].items() if c != AUTO)
                line, = ax.plot([d for d, _ in fixed], [v for _, v in fixed], marker="o", label=workload)
                ax.plot([row["auto_mean_depth"]], [row["tps"][AUTO]["median"]], marker="*", markersize=14, color=line.get_color(),
                        linestyle="none")
            ax.set_title(f"{pair}, width {width}  (star: auto, at its mean depth)", fontsize=9)
            ax.set(xlabel="draft depth", ylabel="tokens/s")
            ax.legend(fontsize=8)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-depth"))
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(PAIRS))
    parser.add_argument("--depths", default="0-4", help="fixed depths beside auto, `0-4` or `0,2` (auto's maxDepth is "
                        "the deepest)")
    parser.add_argument("--widths", default="1,4", help="widths from 1 to 4, `1,4`")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4, help="prompts of each workload per pass")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--mlp-multiplier", type=int, default=8)
    parser.add_argument("--extra-layers", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        args.depths, args.widths = parse_depths(args.depths), parse_widths(args.widths, 4)
    except SweepError as e:
        parser.error(f"{e.message}: {e.hint}" if e.hint else e.message)
    if args.depths[-1] < 1:
        parser.error("--depths needs one depth of at least 1, which auto's maxDepth takes")
    ensure_preload()
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = prepare(args.out / "models", args)
    results = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "pairs": {name: [str(t), str(h)] for name, (t, h) in pairs.items()}, "passes": {}, "summary": {}}
    for name, (target, head) in pairs.items():
        results["passes"][name] = run_pair(name, target, head, args, args.out)
        results["summary"][name] = summarize(results["passes"][name], args.depths)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    lines = report_lines(results)
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    plot(results, args.out / "depth.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
