"""Decode speed with and without a JSON schema, with and without the drafter (in-process engine).

Four configurations, run in interleaved rounds so a noisy neighbour hits each alike, after one
discarded warm-up round: `plain`, `plain+schema`, `drafter`, `drafter+schema`. Each generates
greedily from the same prompt; tok/s is emitted tokens over wall time of the decode (prefill
included). The schema holds one free string, so the constrained output runs as long as the free
one. Raw values go to JSON (`--out`); the table shows median ± MAD and min-max.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
    python bench/scripts/constrained_bench.py --rounds 5 --out constrained.json     # the shipped demo pair
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import sys
import time
from pathlib import Path

from mtpstack.bench.parts import emit
from mtpstack.bench.stats import summarize
from mtpstack.validator import DEPTH_DEFAULT

SCHEMA = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"], "additionalProperties": False}
PROMPT = 'Return the function as JSON.\n{"code": "def parse_args(argv):\\n'
CONFIGS = {"plain": (False, False), "plain+schema": (False, True), "drafter": (True, False), "drafter+schema": (True, True)}


def one_run(engine, prompt: list[int], drafter: bool, schema: bool, tokens: int) -> tuple[float, int, int, int]:
    """(seconds, tokens emitted, drafted, accepted) of one greedy generation."""
    from devkit.engine import run
    from mtpstack.worker.sequence import SamplingParams
    from mtpstack.worker.protocol.chat import grammars_for
    from mtpstack.worker.protocol.grammar import json_grammar
    from mtpstack.worker.protocol.hooks import Constraint, RowHook

    depth = engine.draft_depth if drafter else 0
    seq = engine.new_sequence(prompt, SamplingParams(max_tokens=tokens, depth=depth))
    if schema:
        g = grammars_for(engine)
        seq.hook = RowHook(None, Constraint(g.matcher(json_grammar(SCHEMA)), g.vocab_size))
    start = time.perf_counter()
    run(seq)
    return time.perf_counter() - start, len(seq.tokens), seq.drafted, seq.accepted


def format_lines(report: dict) -> list[str]:
    """Pure: the report as table lines."""
    lines = [f"{report['tokens']} tokens per run, {report['rounds']} rounds (+1 warm-up discarded), depth {report['depth']}",
             "config           tok/s median ± MAD   min-max         tokens/run   accepted/drafted"]
    for name, r in report["configs"].items():
        s = r["tok_s"]
        lines.append(f"{name:<16} {s['median']:7.1f} ± {s['mad']:<6.1f}     {s['min']:.1f}-{s['max']:.1f}"
                     f"      {r['tokens_per_run']:<12.1f} {r['accepted']}/{r['drafted']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(DEMO_TARGET))
    ap.add_argument("--drafter", default=str(DEMO_HEAD))
    ap.add_argument("--depth", type=int, default=DEPTH_DEFAULT)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    from mtpstack.worker.loading import Engine

    engine = Engine.load(args.target, args.drafter, draft_depth=args.depth)
    prompt = engine.text_prompt(PROMPT)
    raw: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds + 1):
        for name, (drafter, schema) in CONFIGS.items():
            secs, n, drafted, accepted = one_run(engine, prompt, drafter, schema, args.tokens)
            if round_:
                raw[name].append({"seconds": secs, "tokens": n, "drafted": drafted, "accepted": accepted})
    report = {"target": args.target, "drafter": args.drafter, "depth": args.depth, "tokens": args.tokens,
              "rounds": args.rounds, "raw": raw, "configs": {}}
    for name, runs in raw.items():
        s = summarize([r["tokens"] / r["seconds"] for r in runs])
        report["configs"][name] = {"tok_s": {"median": s.median, "mad": s.mad, "min": s.min, "max": s.max, "n": s.n},
                                   "tokens_per_run": sum(r["tokens"] for r in runs) / len(runs),
                                   "drafted": sum(r["drafted"] for r in runs), "accepted": sum(r["accepted"] for r in runs)}
    return emit(report, format_lines(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
