"""Constrained-decoding cost on a realistic vocabulary: llguidance (and outlines-core, when importable).

A byte-level BPE tokenizer with about 150k entries is trained here on local text (code and prose,
`devkit.demo.corpus`; ~20 s, cached in `--tokenizer-dir`), as large as the Qwen3.5 family's. For
each library: the tokenizer set-up, the schema compile, and the cost per token of a mask and an
advance while walking a valid document token by token (what the worker does per emitted or
verified position). Raw values go to JSON; `--runs` repeats give median and min-max.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
    python bench/scripts/grammar_bench.py --runs 5 --out grammar.json
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from mtpstack.bench.parts import emit

VOCAB = 150_000
#: A response schema like an agent's: nested object, enum, bounded strings, an array.
SCHEMA = {
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
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), overrides={"whitespace_flexible": False})
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
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    decode = {chr(c): b for b, c in zip(bs, cs)}
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
    regex = oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA), r"")
    index, compile_s = timed(lambda: oc.Index(regex, vocab))
    guide = oc.Guide(index)
    mask = np.zeros((tok.get_vocab_size() + 31) // 32, dtype=np.int32)
    start = time.perf_counter()
    for t in ids:
        guide.write_mask_into(mask.ctypes.data, mask.size, mask.itemsize)
        guide.advance(t, False)
    per_token = (time.perf_counter() - start) / len(ids)
    return {"setup_s": setup, "compile_s": compile_s, "per_token_us": per_token * 1e6, "accepting": guide.is_finished()}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def format_lines(report: dict) -> list[str]:
    """Pure: the report as table lines."""
    lines = [f"vocabulary {report['vocab']} entries, document {report['tokens']} tokens, {report['runs']} runs",
             "library        setup s (med, min-max)     compile s (med, min-max)    us/token (med, min-max)"]
    for lib, r in report["libraries"].items():
        cells = [f"{r[k]['median']:.3f} ({r[k]['min']:.3f}-{r[k]['max']:.3f})" for k in ("setup_s", "compile_s")]
        t = r["per_token_us"]
        cells.append(f"{t['median']:.0f} ({t['min']:.0f}-{t['max']:.0f})")
        lines.append(f"{lib:<14} {cells[0]:<26} {cells[1]:<27} {cells[2]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-dir", type=Path, default=Path("/tmp/mtpstack-bench-tokenizer-150k"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    tok, path = tokenizer(args.tokenizer_dir)
    ids = tok.encode(json.dumps(DOCUMENT, separators=(",", ":"))).ids
    eos = tok.token_to_id("<|endoftext|>")
    raw: dict[str, list[dict]] = {"llguidance": [], "outlines-core": []}
    for _ in range(args.runs):
        raw["llguidance"].append(run_llguidance(path, ids, eos))
        if (o := run_outlines(tok, ids, eos)) is not None:
            raw["outlines-core"].append(o)
    report = {"vocab": tok.get_vocab_size(), "tokens": len(ids), "runs": args.runs, "raw": raw, "libraries": {
        lib: {k: summary([r[k] for r in runs]) for k in ("setup_s", "compile_s", "per_token_us")}
        for lib, runs in raw.items() if runs}}
    return emit(report, format_lines(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
