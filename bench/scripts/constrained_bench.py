"""Constrained decoding's cost (docs/agent-api.md, "Cost" and "Choosing the library"): decode speed with and without
a JSON schema, with and without the drafter (in-process engine); with `--libraries`, the grammar libraries' own.

`plain`, `plain+schema`, `drafter` and `drafter+schema` run greedy from one prompt in interleaved rounds after a
discarded warm-up: emitted tokens over the decode's wall time (prefill included); the schema's one free string lets
the constrained output run as long as the free one. `--libraries`: llguidance (and outlines-core, when importable)
on a 150k-entry byte-level BPE tokenizer (the Qwen3.5 family's size) trained on local text (~20 s, cached in
`--tokenizer-dir`): its set-up, the compile of `AGENT_SCHEMA`, and a mask and an advance per token of a document.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
    python bench/scripts/constrained_bench.py --rounds 5 --out constrained.json     # the shipped demo pair
    python bench/scripts/constrained_bench.py --libraries --rounds 5 --out grammar.json
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from mtpstack.bench.parts import emit, fmt, rounds, spread
from mtpstack.bench.stats import summarize
from mtpstack.validator import DEPTH_DEFAULT

SCHEMA = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"], "additionalProperties": False}
PROMPT = 'Return the function as JSON.\n{"code": "def parse_args(argv):\\n'
CONFIGS = {"plain": (False, False), "plain+schema": (False, True), "drafter": (True, False), "drafter+schema": (True, True)}
#: `--libraries`: the tokenizer's size, a response schema like an agent's (nested object, enum, bounded strings,
#: an array) and a document of it.
VOCAB = 150_000
AGENT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 8},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
#: Each library's figures, and the digits the table gives them.
LIBRARY_FIGURES = {"setup_s": 3, "compile_s": 3, "per_token_us": 0}
DOCUMENT = {"name": "Ada Lovelace", "age": 36, "role": "admin", "tags": ["math", "engines", "poetry"],
            "address": {"city": "London", "zip": "12345"}}


def tokenizer(dir_: Path):
    from tokenizers import Tokenizer

    path = dir_ / "tokenizer.json"
    if not path.exists():
        from devkit.demo import corpus
        from devkit.demo.bpe import train_tokenizer

        texts = corpus.sample(corpus.code_texts(), 40_000_000) + corpus.sample(corpus.prose_texts(), 40_000_000)
        dir_.mkdir(parents=True, exist_ok=True)
        train_tokenizer(texts, vocab_size=VOCAB).save(str(path))
    return Tokenizer.from_file(str(path)), path


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def run_llguidance(tok_path: Path, ids: list[int], eos: int) -> dict:
    import llguidance

    lltok, setup = timed(lambda: llguidance.LLTokenizer(tok_path.read_text(), eos_token=eos))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(AGENT_SCHEMA),
                                                            overrides={"whitespace_flexible": False})
    matcher, compile_s = timed(lambda: llguidance.LLMatcher(lltok, grammar, log_level=0))
    assert not matcher.is_error(), matcher.get_error()
    start = time.perf_counter()
    for t in ids:
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        assert bits[t >> 3] >> (t & 7) & 1, "the document left the grammar"
        matcher.consume_token(t)
    per_token = (time.perf_counter() - start) / len(ids)
    return {"setup_s": setup, "compile_s": compile_s, "per_token_us": per_token * 1e6, "accepting": matcher.is_accepting()}


def _byte_vocab(tok) -> dict[bytes, list[int]]:
    """Each token's bytes, undoing the byte-level alphabet (GPT-2's) that outlines-core does not know."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decode = {c: b for b, c in bytes_to_unicode().items()}
    out: dict[bytes, list[int]] = {}
    for text, i in tok.get_vocab().items():
        if all(ch in decode for ch in text):
            out.setdefault(bytes(decode[ch] for ch in text), []).append(i)
    return out


def run_outlines(tok, ids: list[int], eos: int) -> dict | None:
    try:
        import outlines_core as oc
    except ImportError:
        return None
    vocab_map = {k: [i for i in v if i != eos] for k, v in _byte_vocab(tok).items()}
    vocab, setup = timed(lambda: oc.Vocabulary(eos, {k: v for k, v in vocab_map.items() if v}))
    regex = oc.json_schema.build_regex_from_schema(json.dumps(AGENT_SCHEMA), r"")
    index, compile_s = timed(lambda: oc.Index(regex, vocab))
    guide = oc.Guide(index)
    mask = np.zeros((tok.get_vocab_size() + 31) // 32, dtype=np.int32)
    start = time.perf_counter()
    for t in ids:
        guide.write_mask_into(mask.ctypes.data, mask.size, mask.itemsize)
        guide.advance(t, False)
    per_token = (time.perf_counter() - start) / len(ids)
    return {"setup_s": setup, "compile_s": compile_s, "per_token_us": per_token * 1e6, "accepting": guide.is_finished()}


def one_run(engine, prompt: list[int], drafter: bool, schema: bool, tokens: int) -> dict:
    """One greedy generation's seconds, tokens emitted, drafted and accepted."""
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
    return {"seconds": time.perf_counter() - start, "tokens": len(seq.tokens), "drafted": seq.drafted,
            "accepted": seq.accepted}


def format_lines(report: dict) -> list[str]:
    lines = [f"{report['tokens']} tokens per run, {report['rounds']} rounds (+1 warm-up discarded), depth {report['depth']}",
             "config           tok/s median ± MAD   min-max         tokens/run   accepted/drafted"]
    for name, r in report["configs"].items():
        s = r["tok_s"]
        lines.append(f"{name:<16} {s['median']:7.1f} ± {s['mad']:<6.1f}     {s['min']:.1f}-{s['max']:.1f}"
                     f"      {r['tokens_per_run']:<12.1f} {r['accepted']}/{r['drafted']}")
    return lines


def library_lines(report: dict) -> list[str]:
    lines = [f"vocabulary {report['vocab']} entries, document {report['tokens']} tokens, {report['runs']} runs",
             "library        setup s (med, min-max)     compile s (med, min-max)    us/token (med, min-max)"]
    for lib, r in report["libraries"].items():
        setup, compile_s, per_token = (fmt(r[k], digits=d, count=False) for k, d in LIBRARY_FIGURES.items())
        lines.append(f"{lib:<14} {setup:<26} {compile_s:<27} {per_token}")
    return lines


def run_libraries(args) -> int:
    tok, path = tokenizer(args.tokenizer_dir)
    ids = tok.encode(json.dumps(DOCUMENT, separators=(",", ":"))).ids
    eos = tok.token_to_id("<|endoftext|>")
    raw: dict[str, list[dict]] = {"llguidance": [], "outlines-core": []}
    for _ in range(args.rounds):
        raw["llguidance"].append(run_llguidance(path, ids, eos))
        if (o := run_outlines(tok, ids, eos)) is not None:
            raw["outlines-core"].append(o)
    report = {"vocab": tok.get_vocab_size(), "tokens": len(ids), "runs": args.rounds, "raw": raw, "libraries": {
        lib: {k: spread([r[k] for r in runs]) for k in LIBRARY_FIGURES}
        for lib, runs in raw.items() if runs}}
    return emit(report, library_lines(report), args.out)


def main(argv: list[str] | None = None) -> int:
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(DEMO_TARGET))
    ap.add_argument("--drafter", default=str(DEMO_HEAD))
    ap.add_argument("--depth", type=int, default=DEPTH_DEFAULT)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", "--runs", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--libraries", action="store_true", help="the grammar libraries' cost per token instead (no model)")
    ap.add_argument("--tokenizer-dir", type=Path, default=Path("/tmp/mtpstack-bench-tokenizer-150k"))
    args = ap.parse_args(argv)
    if args.libraries:
        return run_libraries(args)

    from mtpstack.worker.loading import Engine

    engine = Engine.load(args.target, args.drafter, draft_depth=args.depth)
    prompt = engine.text_prompt(PROMPT)
    raw: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for _, keep in rounds(1, args.rounds):
        for name, (drafter, schema) in CONFIGS.items():
            run = one_run(engine, prompt, drafter, schema, args.tokens)
            if keep:
                raw[name].append(run)
    configs = {name: {"tok_s": asdict(summarize([r["tokens"] / r["seconds"] for r in runs])),
                      "tokens_per_run": sum(r["tokens"] for r in runs) / len(runs),
                      **{k: sum(r[k] for r in runs) for k in ("drafted", "accepted")}} for name, runs in raw.items()}
    report = {"target": args.target, "drafter": args.drafter, "depth": args.depth, "tokens": args.tokens,
              "rounds": args.rounds, "raw": raw, "configs": configs}
    return emit(report, format_lines(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
