"""Fixed single depths against the depth per class, side by side on a mixed code/prose workload.

One worker started with a depth map (its deepest class at least the deepest fixed depth asked for);
every arm runs in that one process, in rotating order pass by pass (a pass runs every arm once),
so slow drift is shared. Arm `map` sends the prompts as they are (the worker classifies them); arm
`fixed D` names the deepest class (`mtpstack_class`) and lowers it to D with `num_draft_tokens`.
A pass of an arm: the code and prose prompts interleaved, one request at a time, greedy; its tok/s is
completion tokens over the wall time of the whole pass. Verdicts: `mtpstack.bench.stats.decide_paired`.

    python bench/scripts/mixed.py --url http://127.0.0.1:18716 --deep-class code --fixed 1,2,3,4 --passes 10
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import urllib.request
from pathlib import Path

from mtpstack.bench.stats import decide_paired, summarize
from mtpstack.bench.sweep import load_prompts


def run_arm(url: str, prompts: list[str], extra: dict, max_tokens: int) -> dict:
    tokens, texts = 0, []
    started = time.perf_counter()
    for prompt in prompts:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, **extra}
        req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            answer = json.loads(resp.read())
        tokens += answer["usage"]["completion_tokens"]
        texts.append(answer["choices"][0]["message"]["content"])
    seconds = time.perf_counter() - started
    return {"tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "output_sha256": hashlib.sha256("\0".join(texts).encode()).hexdigest()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--deep-class", default="code", help="the map's deepest class (default: code)")
    p.add_argument("--fixed", default="1,2,3,4", help="fixed depths to run beside the map (default: 1,2,3,4)")
    p.add_argument("--passes", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    code, prose = load_prompts("code"), load_prompts("prose")
    prompts = [x.prompt for pair in zip(code, prose) for x in pair]
    arms = {f"fixed {d}": {"mtpstack_class": args.deep_class, "num_draft_tokens": int(d)} for d in args.fixed.split(",")}
    arms["map"] = {}
    names = list(arms)
    for name in names:  # warm-up, discarded
        run_arm(args.url, prompts[:2], arms[name], args.max_tokens)
    passes: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(args.passes):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            passes[name].append(run_arm(args.url, prompts, arms[name], args.max_tokens))
    values = {n: [r["tok_s"] for r in passes[n]] for n in names}
    hashes = {r["output_sha256"] for n in names for r in passes[n]}
    lines = [f"{len(prompts)} prompts (code and prose interleaved), max_tokens {args.max_tokens}, {args.passes} passes,"
             f" arms in rotating order in one worker; outputs identical across arms and passes: {len(hashes) == 1}"]
    for n in names:
        s = summarize(values[n])
        lines.append(f"{n:8} median {s.median:7.1f} tok/s  min-max {s.min:.1f}-{s.max:.1f}  n {s.n}")
    fixed = [n for n in names if n != "map"]
    best = max(fixed, key=lambda n: summarize(values[n]).median)
    for n in fixed:
        v = decide_paired(values[n], values["map"])
        mark = "  <- best single depth" if n == best else ""
        ratio = "-" if v.ratio is None else f"{v.ratio:.3f} [{v.lo:.3f}, {v.hi:.3f}]"
        lines.append(f"map / {n}: {ratio} -> {v.decision}{mark}")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"arms": arms, "passes": passes, "summary": lines}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
