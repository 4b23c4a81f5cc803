"""Arms alternated in one live worker, each a setting a request carries, judged by the paired rule (docs/bench.md).

A pass runs every arm once, in rotating order, after one discarded warm-up of each; an arm's tok/s is completion
tokens over the wall time of its requests, sent one at a time, greedy, each run to `--max-tokens`. `--depths A,B`: two
depths on one fixed prompt, the runs in time order for `mtpstack bench simulate --rho-from`; `--map`: the worker's
depth per class against fixed depths (the deepest class, `--deep-class`, lowered by `num_draft_tokens`), on the code
and prose prompts interleaved.

    python bench/scripts/alternate.py --url http://127.0.0.1:8101 --depths 0,3 --pairs 20 --out runs.json
    python bench/scripts/alternate.py --url http://127.0.0.1:18716 --map --deep-class code --fixed 1,2,3,4 --passes 10
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from mtpstack.bench.parts import post_json, rotated
from mtpstack.bench.stats import decide, neighbour_correlation, summarize
from mtpstack.bench.sweep import load_prompts

PROMPT = "def fibonacci(n):\n"


def run_arm(url: str, path: str, bodies: list[dict]) -> dict:
    """The requests of one run, one at a time: its tok/s over their wall time, and a hash of their texts."""
    tokens, drafted, texts = 0, 0, []
    started = time.perf_counter()
    for body in bodies:
        answer = post_json(url, path, body, timeout=300)
        tokens += answer["usage"]["completion_tokens"]
        drafted += answer["usage"].get("draft_tokens") or 0
        choice = answer["choices"][0]
        texts.append(choice["text"] if "text" in choice else choice["message"]["content"])
    seconds = time.perf_counter() - started
    return {"tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "draft_tokens": drafted,
            "output_sha256": hashlib.sha256("\0".join(texts).encode()).hexdigest()}


def arms_of(args) -> tuple[str, dict[str, list[dict]], list[tuple[str, str]]]:
    """The endpoint, each arm's requests, and the comparisons (candidate, base) to judge."""
    greedy = {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
    if not args.map:
        a, b = (int(x) for x in args.depths.split(","))
        arms = {f"depth {d}": [{"prompt": PROMPT, **greedy, "num_draft_tokens": d}] for d in (a, b)}
        return "/v1/completions", arms, [(f"depth {b}", f"depth {a}")]
    code, prose = load_prompts("code"), load_prompts("prose")
    messages = [[{"role": "user", "content": x.prompt}] for pair in zip(code, prose) for x in pair]
    arms = {f"fixed {d}": [{"messages": m, **greedy, "mtpstack_class": args.deep_class, "num_draft_tokens": int(d)}
                           for m in messages] for d in args.fixed.split(",")}
    arms["map"] = [{"messages": m, **greedy} for m in messages]
    return "/v1/chat/completions", arms, [("map", name) for name in arms if name != "map"]


def report(arms: dict, runs: list[dict], comparisons: list[tuple[str, str]], max_tokens: int) -> dict:
    """The runs' summary lines, whether every output was the same text, and the drift correlation."""
    values = {name: [r["tok_s"] for r in runs if r["config"] == name] for name in arms}
    identical = len({r["output_sha256"] for r in runs}) == 1
    lines = [f"{len(next(iter(arms.values())))} request(s) a run, max_tokens {max_tokens}, {len(runs) // len(arms)} "
             f"passes, arms in rotating order in one worker; outputs identical across arms and passes: {identical}"]
    for name, v in values.items():
        s = summarize(v)
        lines.append(f"{name:8} median {s.median:7.1f} tok/s  min-max {s.min:.1f}-{s.max:.1f}  n {s.n}")
    best = max({base for _, base in comparisons}, key=lambda n: summarize(values[n]).median)
    for cand, base in comparisons:
        v = decide(values[base], values[cand], paired=True)
        ratio = "-" if v.ratio is None else f"{v.ratio:.3f} [{v.lo:.3f}, {v.hi:.3f}]"
        mark = "  <- best single depth" if len(comparisons) > 1 and base == best else ""
        lines.append(f"{cand} / {base}: {ratio} -> {v.decision}{mark}")
    rho = neighbour_correlation([r["config"] for r in runs], [r["tok_s"] for r in runs])
    lines.append(f"drift correlation between neighbouring runs: {rho if rho is None else round(rho, 3)}")
    return {"identical_text": identical, "rho": rho, "summary": lines}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the worker's base URL")
    p.add_argument("--depths", default="0,3", help="two depths, A,B (default: 0,3)")
    p.add_argument("--map", action="store_true", help="the worker's depth map against fixed depths (`--fixed`)")
    p.add_argument("--deep-class", default="code", help="with --map: the map's deepest class (default: code)")
    p.add_argument("--fixed", default="1,2,3,4", help="with --map: fixed depths beside the map (default: 1,2,3,4)")
    p.add_argument("--passes", "--pairs", type=int, help="passes, every arm once each (default: 20; with --map 10)")
    p.add_argument("--max-tokens", type=int, help="tokens per request (default: 64; with --map 32)")
    p.add_argument("--out", type=Path, help="where to write the runs (JSON)")
    args = p.parse_args(argv)
    args.passes = args.passes or (10 if args.map else 20)
    args.max_tokens = args.max_tokens or (32 if args.map else 64)
    path, arms, comparisons = arms_of(args)
    for bodies in arms.values():  # warm-up, discarded
        run_arm(args.url, path, bodies[:2])
    runs = [{"config": name, **run_arm(args.url, path, arms[name])}
            for i in range(args.passes) for name in rotated(list(arms), i)]
    result = report(arms, runs, comparisons, args.max_tokens)
    print("\n".join(result["summary"]))
    if args.out:
        args.out.write_text(json.dumps({"url": args.url, "arms": arms, "passes": args.passes,
                                        "max_tokens": args.max_tokens, "runs": runs, **result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
