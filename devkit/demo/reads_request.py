"""How much the demo target's answer depends on the user's request, after a system message of N tokens.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m devkit.demo.reads_request --models worker/demo/models --lengths 0,64,2048,16384

For each length: the cosine similarity of the target's last hidden state (what its LM head reads
to choose the answer's first token) between two requests, and its greedy answers to both. A target
that reads its prompt answers "say hi" and "list the files in this folder" differently; one whose
similarity stays near 1 cannot be taught to act on one and not the other by agent turns alone
(docs/demo-models.md, "Calling tools")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlx.core as mx

from devkit.demo import corpus

REQUESTS = ("say hi", "list the files in this folder")


def probe(model, tokenizer, system: str | None, requests=REQUESTS, *, max_tokens: int = 16) -> tuple[float, list[str]]:
    """(cosine similarity of the last hidden state between the first two requests, the greedy answers)."""
    from mlx_lm.generate import stream_generate

    from mtpstack.worker.protocol.chat import render_template

    states, answers = [], []
    for request in requests:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": request}]
        prompt = list(render_template(tokenizer, messages, None, {"enable_thinking": False}, add_generation_prompt=True))
        states.append(model.language_model.model(mx.array([prompt]))[0, -1].astype(mx.float32))
        answers.append(tokenizer.decode([r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens)]))
    a, b = states[0], states[1]
    return (a * b).sum().item() / (mx.linalg.norm(a) * mx.linalg.norm(b)).item(), answers


def main(argv: list[str] | None = None) -> int:
    import mlx_lm

    parser = argparse.ArgumentParser(prog="python -m devkit.demo.reads_request", description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, default=Path("worker/demo/models"), help="MODELS/target is probed")
    parser.add_argument("--lengths", default="0,64,512,2048,8192", help="system message lengths in tokens, comma-separated")
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    model, tokenizer = mlx_lm.load(str(args.models / "target"))
    ids = tokenizer.encode("\n".join(corpus.sample(corpus.prose_texts(), 4 * max(lengths) + 1000)), add_special_tokens=False)
    for n in lengths:
        similarity, answers = probe(model, tokenizer, tokenizer.decode(ids[:n]) if n else None)
        print(f"{n:6d} tokens: similarity {similarity:.4f}; " + " | ".join(repr(a) for a in answers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
