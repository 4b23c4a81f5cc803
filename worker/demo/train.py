"""Train the shipped demo pair: a small qwen3 target and a 1-layer drafter, on local code and prose.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m worker.demo.train --out worker/demo/models --seed 0

The drafter stands in for a multi-token-prediction head: trained on the same text as the target,
shipped as its own model directory and loaded as the draft model. Both use the committed demo
tokenizer (`worker/demo/tokenizer`, rebuilt with `python -m worker.demo.bpe`). Training follows a
fixed seed and step count; it is not bit-reproducible across machines (the text found under
/usr/share/doc differs between installs, and BLAS summation order varies).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from tokenizers import Tokenizer

from worker.demo import TOKENIZER_DIR, corpus
from worker.demo.bpe import ENDOFTEXT
from worker.demo.modeldir import build_model, parameter_count, qwen3_config, save_model_dir

TARGET = dict(
    hidden_size=256, num_hidden_layers=4, intermediate_size=768, num_attention_heads=4, num_key_value_heads=2
)
DRAFTER = dict(
    hidden_size=256, num_hidden_layers=1, intermediate_size=768, num_attention_heads=4, num_key_value_heads=2
)
CODE_CHARS = 1_500_000
PROSE_CHARS = 1_500_000
SEQ_LEN = 128
BATCH = 16
VALID_SHARE = 0.02


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def token_stream(tokenizer_dir: Path = TOKENIZER_DIR) -> list[list[int]]:
    """Code and prose documents, tokenized, each followed by `<|endoftext|>`."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eot = tok.token_to_id(ENDOFTEXT)
    docs = corpus.sample(corpus.code_texts(), CODE_CHARS) + corpus.sample(corpus.prose_texts(), PROSE_CHARS)
    encoded = [e.ids + [eot] for e in tok.encode_batch(docs)]
    return encoded


def split_docs(encoded: list[list[int]], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(len(encoded))
    n_valid = max(1, int(len(encoded) * VALID_SHARE))
    valid = np.concatenate([encoded[i] for i in order[:n_valid]]).astype(np.int32)
    train = np.concatenate([encoded[i] for i in order[n_valid:]]).astype(np.int32)
    return train, valid


def batches(data: np.ndarray, rng: np.random.Generator):
    """Endless random windows of SEQ_LEN + 1 tokens (inputs and shifted targets)."""
    while True:
        starts = rng.integers(0, len(data) - SEQ_LEN - 1, size=BATCH)
        window = np.stack([data[s : s + SEQ_LEN + 1] for s in starts])
        yield mx.array(window[:, :-1]), mx.array(window[:, 1:])


def loss_fn(model, inputs, targets):
    logits = model(inputs)
    return nn.losses.cross_entropy(logits, targets, reduction="mean")


def evaluate(model, data: np.ndarray, max_windows: int = 64) -> float:
    n = min(max_windows, (len(data) - 1) // SEQ_LEN)
    losses = []
    for i in range(0, n, BATCH):
        idx = np.arange(i, min(i + BATCH, n)) * SEQ_LEN
        window = np.stack([data[s : s + SEQ_LEN + 1] for s in idx])
        losses.append(loss_fn(model, mx.array(window[:, :-1]), mx.array(window[:, 1:])).item())
    return float(np.mean(losses))


def train_model(name: str, config: dict, train: np.ndarray, valid: np.ndarray, *, steps: int, lr: float,
                seed: int):
    mx.random.seed(seed)
    model = build_model(config)
    log(f"{name}: {parameter_count(model) / 1e6:.2f}M parameters, {steps} steps of {BATCH}x{SEQ_LEN} tokens")
    warmup = max(1, steps // 20)
    schedule = optim.join_schedules(
        [optim.linear_schedule(lr / 10, lr, warmup), optim.cosine_decay(lr, steps - warmup, lr / 10)], [warmup]
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    state = [model.state, optimizer.state]
    loss_and_grad = nn.value_and_grad(model, loss_fn)

    @partial(mx.compile, inputs=state, outputs=state)
    def step(inputs, targets):
        loss, grads = loss_and_grad(model, inputs, targets)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    rng = np.random.default_rng(seed)
    data = batches(train, rng)
    start = time.monotonic()
    running = None
    for i in range(1, steps + 1):
        inputs, targets = next(data)
        loss = step(inputs, targets)
        mx.eval(state, loss)
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if i % 10 == 0 or i == steps:
            elapsed = time.monotonic() - start
            eta = elapsed / i * (steps - i)
            tps = i * BATCH * SEQ_LEN / elapsed
            log(f"{name} step {i}/{steps} loss {running:.3f} {tps:,.0f} tok/s eta {eta:.0f}s")
    val = evaluate(model, valid)
    log(f"{name}: validation loss {val:.3f} after {time.monotonic() - start:.0f}s")
    return model, val


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.demo.train", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="writes OUT/target and OUT/drafter")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-steps", type=int, default=700)
    parser.add_argument("--drafter-steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    encoded = token_stream()
    train, valid = split_docs(encoded, np.random.default_rng(args.seed))
    log(f"data: {len(encoded)} documents, {len(train):,} training and {len(valid):,} validation tokens "
        f"({time.monotonic() - t0:.0f}s)")

    for name, shape, steps, seed in (
        ("target", TARGET, args.target_steps, args.seed),
        ("drafter", DRAFTER, args.drafter_steps, args.seed + 1),
    ):
        config = qwen3_config(**shape)
        model, _ = train_model(name, config, train, valid, steps=steps, lr=args.lr, seed=seed)
        out = save_model_dir(model, config, args.out / name)
        log(f"wrote {out}")
    log(f"done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
