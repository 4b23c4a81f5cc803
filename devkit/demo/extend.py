"""Extend the trained demo pair to the Qwen3.5 family's chat format, in place, keeping its text exactly.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m devkit.demo.extend --models worker/demo/models

`devkit.demo.train` trains on the plain demo tokenizer (ChatML, ids 0-1023) and runs this at its
end. It takes MODELS/target and MODELS/mtp as trained and:

- writes the tokenizer with the family's markers added after the existing ids (`<think>` ...
  `</tool_response>`, ids 1024-1029) and the family's template (`devkit.demo.family`: tools in the
  system prompt, `qwen3_coder` calls, tool messages as `<tool_response>`), thinking off unless a
  request turns it on (`enable_thinking: true`, or any `reasoning_effort` but none/minimal);
- grows the target's tied embedding matrix by one row per marker. Each new row has the norm of a
  typical existing row and points away from the mean of the target's final hidden states on the
  training text (plus a distinct random part, so the markers differ as inputs): on ordinary text
  its logit stays far below the winning one, so greedy text is unchanged;
- raises the context (`max_position_embeddings`, `model_max_length`) to `CONTEXT`, so tool
  definitions and an agent's prompt fit; the head folder's `text_config` follows the target's.

It then checks what it promises: the greedy tokens of code and prose prompts are the same before
and after, and no marker's logit wins at any position of a sample of the training text (it prints
the smallest margin). The head needs nothing of its own: it borrows the target's embeddings and
LM head, so its drafts gain the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from devkit.demo import TOKENIZER_DIR, corpus
from devkit.demo.acceptance import CODE_PROMPTS, PROSE_PROMPTS
from devkit.demo.bpe import TOKENIZER_FILES
from devkit.demo.family import MARKERS, write_family_tokenizer
from mtpstack.errors import UserError, print_error

#: The extended demo's context: Claude Code sends 22-38k tokens before a conversation's first word, Codex
#: about 17k, and a session fills the rest (the target's forward does not depend on it: plain RoPE).
CONTEXT = 131072
EMBEDDINGS = "language_model.model.embed_tokens.weight"
#: Sample of the training text the direction and the margin are measured on.
SAMPLE_CHARS = 20_000
SAMPLE_TOKENS_PER_DOC = 512
#: The fix for a pair that is not as `devkit.demo.train` trains it.
FROM_TRAINING = "extend the pair as `python -m devkit.demo.train` trains it (the script runs this step itself)"
#: Weight of each new row's random part beside the direction away from the mean hidden state.
NOISE = 0.5
GREEDY_TOKENS = 64


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class ExtendError(UserError):
    """The pair cannot be extended (or extending it would change its text)."""


def sample_ids(tokenizer, texts: list[str] | None = None) -> list[list[int]]:
    """The first tokens of each of `texts` (by default a small sample of the training text), with `tokenizer`
    (a `tokenizers.Tokenizer`)."""
    if texts is None:
        texts = corpus.sample(corpus.code_texts(), SAMPLE_CHARS) + corpus.sample(corpus.prose_texts(), SAMPLE_CHARS)
    ids = [e.ids[:SAMPLE_TOKENS_PER_DOC] for e in tokenizer.encode_batch(texts)]
    if not any(ids):
        raise ExtendError("no text to measure the hidden states on: the corpus found no code or prose here",
                          "run it where Python's standard library sources or /usr/share/doc are installed")
    return ids


def final_hidden(model, docs: list[list[int]]) -> np.ndarray:
    """The target's final (post-norm) hidden states at every position of `docs`, stacked."""
    text = model.language_model.model
    return np.concatenate([np.array(text(mx.array([ids]))[0]) for ids in docs if ids])


def new_rows(embeddings: np.ndarray, hidden: np.ndarray, n: int, seed: int) -> np.ndarray:
    mean = hidden.mean(axis=0)
    away = -mean / np.linalg.norm(mean)
    noise = np.random.default_rng(seed).standard_normal((n, embeddings.shape[1]))
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    rows = away + NOISE * noise
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows * np.median(np.linalg.norm(embeddings, axis=1))).astype(np.float32)


def greedy(model_dir: Path, prompts) -> list[list[int]]:
    import mlx_lm
    from mlx_lm.generate import stream_generate

    model, tokenizer = mlx_lm.load(str(model_dir))
    return [[r.token for r in stream_generate(model, tokenizer, tokenizer.encode(p), max_tokens=GREEDY_TOKENS)]
            for p in prompts]


def extend(models: Path, *, seed: int = 0, texts: list[str] | None = None) -> dict:
    """Extend MODELS/target and MODELS/mtp in place; returns what was checked (margin, prompts, vocab).
    `texts`: where the hidden states are measured (default: a sample of the training text)."""
    from mlx_lm.utils import load_model
    from tokenizers import Tokenizer

    target, head = Path(models) / "target", Path(models) / "mtp"
    config = json.loads((target / "config.json").read_text())
    head_config = json.loads((head / "config.json").read_text())
    text_config = config["text_config"]
    plain = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    base = plain.get_vocab_size()
    if text_config["vocab_size"] != base:
        raise ExtendError(f"`{target}` has {text_config['vocab_size']} embedding rows, not the plain demo tokenizer's "
                          f"{base}: it is extended already (or not the demo's)", FROM_TRAINING)
    weights = mx.load(str(target / "model.safetensors"))
    embeddings = np.array(weights[EMBEDDINGS])
    if embeddings.shape[0] != base or not config.get("tie_word_embeddings"):
        raise ExtendError(f"`{target}` is not a demo target with {base} tied embedding rows", FROM_TRAINING)

    prompts = CODE_PROMPTS + PROSE_PROMPTS
    before = greedy(target, prompts)
    model, _ = load_model(target)
    docs = sample_ids(plain, texts)
    hidden = final_hidden(model, docs)
    rows = new_rows(embeddings, hidden, len(MARKERS), seed)
    top = (hidden @ embeddings.T).max(axis=1)
    margin = float((top - (hidden @ rows.T).max(axis=1)).min())
    if margin <= 0:
        raise ExtendError(f"a marker's logit would win on the sample text (margin {margin:.2f})",
                          "try another `--seed` for the rows' random part")

    with tempfile.TemporaryDirectory(dir=models, prefix=".extend-") as tmp:  # beside the pair: files replaced, not rewritten
        staged = Path(tmp) / "target"
        shutil.copytree(target, staged)
        vocab = write_family_tokenizer(TOKENIZER_DIR, staged, context=CONTEXT, thinking_by_default=False)
        assert vocab == base + len(MARKERS)
        weights[EMBEDDINGS] = mx.array(np.concatenate([embeddings, rows]))
        mx.save_safetensors(str(staged / "model.safetensors"), weights, metadata={"format": "mlx"})
        text_config.update(vocab_size=vocab, max_position_embeddings=CONTEXT)
        (staged / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        after = greedy(staged, prompts)
        if after != before:
            changed = [p for p, a, b in zip(prompts, after, before) if a != b]
            raise ExtendError(f"greedy text changed for {len(changed)} prompt(s), first {changed[0]!r}",
                              "try another `--seed` for the rows' random part")
        for name in ("model.safetensors", "config.json", *TOKENIZER_FILES):
            os.replace(staged / name, target / name)
    head_config["text_config"].update(vocab_size=vocab, max_position_embeddings=CONTEXT)
    (head / "config.json").write_text(json.dumps(head_config, indent=2) + "\n")
    return {"vocab_size": vocab, "context": CONTEXT, "positions": len(hidden), "margin": margin,
            "prompts": len(prompts), "greedy_tokens": sum(map(len, after))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.demo.extend", description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="the pair's folder: MODELS/target and MODELS/mtp")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        done = extend(args.models, seed=args.seed)
    except ExtendError as e:
        return print_error(e)
    log(f"extended `{args.models}`: vocabulary {done['vocab_size']} ({', '.join(MARKERS)} added), context "
        f"{done['context']}; greedy text of {done['prompts']} prompts unchanged ({done['greedy_tokens']} tokens); "
        f"on {done['positions']} positions of training text the best marker logit stays {done['margin']:.2f} "
        f"below the winning one")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
