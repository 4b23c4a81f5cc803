"""Train the shipped demo pair: a tiny Qwen3.5-family hybrid target and its MTP head, on local code and prose.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m devkit.demo.train --out worker/demo/models --seed 0

Writes OUT/target (a `qwen3_5` model directory in mlx-lm's format, built with mlx-lm's own class)
and OUT/mtp (a standalone `qwen3_5_mtp` head folder, the format mlx-vlm's splitter writes). The
target is trained first; then, with the target frozen, the head learns to predict token t+2 from
the target's final hidden state at t and the embedding of token t+1 (and, with a smaller weight,
token t+3 from its own output and token t+2: the depth-2 chain). Both train on the committed demo
tokenizer (`devkit/demo/tokenizer`, rebuilt with `python -m devkit.demo.bpe`); then the pair is
extended to the Qwen3.5 family's chat format (`devkit.demo.extend`: the markers' tokens, the
template, a 32k context), keeping its greedy text exactly. Training follows a
fixed seed and step count; it is not bit-reproducible across machines (the text found under
/usr/share/doc differs between installs, and BLAS summation order varies).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from tokenizers import Tokenizer

from devkit.demo import TOKENIZER_DIR, corpus
from devkit.demo.bpe import ENDOFTEXT
from devkit.demo.extend import ExtendError, extend
from devkit.demo.modeldir import (
    build_head,
    build_qwen3_5,
    head_config,
    parameter_count,
    qwen3_5_config,
    qwen3_5_text_config,
    save_head_dir,
    save_model_dir,
)
from mtpstack.errors import print_error

# Layers 0 and 2 are gated-delta linear attention, layers 1 and 3 full attention.
TARGET = dict(
    hidden_size=256, num_hidden_layers=4, intermediate_size=768, full_attention_interval=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
)
CODE_CHARS = 1_500_000
PROSE_CHARS = 1_500_000
SEQ_LEN = 128
BATCH = 16
VALID_SHARE = 0.02
#: Weight of the depth-2 loss (the head fed its own output hidden and token t+2, predicting t+3).
DEPTH2_WEIGHT = 0.5


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


def batches(data: np.ndarray, rng: np.random.Generator, width: int):
    """Endless random windows of `width` tokens."""
    while True:
        starts = rng.integers(0, len(data) - width, size=BATCH)
        yield mx.array(np.stack([data[s : s + width] for s in starts]))


def target_loss(model, window: mx.array) -> mx.array:
    """Next-token cross-entropy over a window of SEQ_LEN + 1 tokens."""
    logits = model(window[:, :-1])
    return nn.losses.cross_entropy(logits, window[:, 1:], reduction="mean")


def head_losses(head, target, window: mx.array) -> tuple[mx.array, mx.array]:
    """Depth-1 and depth-2 cross-entropy of the head over a window of SEQ_LEN + 3 tokens; the target is frozen.

    Depth 1, at each position t: the target's final (post-norm) hidden state h[t] and the target's
    embedding of x[t+1] predict x[t+2] through the target's (tied) LM head. Depth 2: the head's own
    output at t and the embedding of x[t+2] predict x[t+3]. Each depth is one causal, cache-less pass.
    """
    n = SEQ_LEN
    text = target.language_model.model
    hidden = mx.stop_gradient(text(window[:, :n]))
    embed = text.embed_tokens
    out1 = head(mx.stop_gradient(embed(window[:, 1 : n + 1])), hidden, [None] * len(head.layers))
    loss1 = nn.losses.cross_entropy(embed.as_linear(out1), window[:, 2 : n + 2], reduction="mean")
    out2 = head(mx.stop_gradient(embed(window[:, 2 : n + 2])), out1, [None] * len(head.layers))
    loss2 = nn.losses.cross_entropy(embed.as_linear(out2), window[:, 3 : n + 3], reduction="mean")
    return loss1, loss2


def evaluate(loss: Callable[[mx.array], mx.array | tuple], data: np.ndarray, width: int,
             max_windows: int = 64) -> np.ndarray:
    """Mean of `loss` (one value or a tuple) over up to `max_windows` consecutive held-out windows."""
    n = min(max_windows, (len(data) - 1) // width)
    values = []
    for i in range(0, n, BATCH):
        starts = np.arange(i, min(i + BATCH, n)) * width
        out = loss(mx.array(np.stack([data[s : s + width] for s in starts])))
        values.append([v.item() for v in (out if isinstance(out, tuple) else (out,))])
    return np.mean(values, axis=0)


def fit(name: str, module: nn.Module, loss: Callable[[nn.Module, mx.array], mx.array], data, *, steps: int,
        lr: float, width: int) -> float:
    """AdamW with warm-up and cosine decay on `module`'s parameters; returns the training time in seconds."""
    warmup = max(1, steps // 20)
    schedule = optim.join_schedules(
        [optim.linear_schedule(lr / 10, lr, warmup), optim.cosine_decay(lr, steps - warmup, lr / 10)], [warmup]
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    loss_and_grad = nn.value_and_grad(module, loss)
    start = time.monotonic()
    running = None
    for i in range(1, steps + 1):
        # Not mx.compile'd: compiling the gated-delta recurrence costs ~50 s and gains nothing on CPU.
        value, grads = loss_and_grad(module, next(data))
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(module, grads)
        mx.eval(module.parameters(), optimizer.state, value)
        running = value.item() if running is None else 0.9 * running + 0.1 * value.item()
        if i % 10 == 0 or i == steps:
            elapsed = time.monotonic() - start
            log(f"{name} step {i}/{steps} loss {running:.3f} {i * BATCH * width / elapsed:,.0f} tok/s "
                f"eta {elapsed / i * (steps - i):.0f}s")
    return time.monotonic() - start


def train_target(text_config: dict, train, valid, *, steps: int, lr: float, seed: int):
    mx.random.seed(seed)
    model = build_qwen3_5(qwen3_5_config(text_config))
    log(f"target: {parameter_count(model) / 1e6:.2f}M parameters, {steps} steps of {BATCH}x{SEQ_LEN} tokens")
    width = SEQ_LEN + 1
    seconds = fit("target", model, target_loss, batches(train, np.random.default_rng(seed), width),
                  steps=steps, lr=lr, width=width)
    model.eval()
    (val,) = evaluate(lambda w: target_loss(model, w), valid, width)
    log(f"target: validation loss {val:.3f} after {seconds:.0f}s")
    return model


def train_head(target, text_config: dict, train, valid, *, steps: int, lr: float, seed: int):
    mx.random.seed(seed)
    config = head_config(text_config)
    head = build_head(config)
    target.eval()
    target.freeze()
    log(f"head: {parameter_count(head) / 1e6:.2f}M parameters, {steps} steps of {BATCH}x{SEQ_LEN} tokens "
        f"(depth-2 weight {DEPTH2_WEIGHT})")

    def loss(module, window):
        loss1, loss2 = head_losses(module, target, window)
        return loss1 + DEPTH2_WEIGHT * loss2

    width = SEQ_LEN + 3
    seconds = fit("head", head, loss, batches(train, np.random.default_rng(seed), width), steps=steps, lr=lr,
                  width=width)
    head.eval()
    val1, val2 = evaluate(lambda w: head_losses(head, target, w), valid, width)
    log(f"head: validation loss {val1:.3f} at depth 1 (token t+2), {val2:.3f} at depth 2 (t+3) "
        f"after {seconds:.0f}s")
    return head, config


def check_reload(model, model_dir: Path, valid: np.ndarray) -> None:
    """Fail unless mlx-lm loads the saved target to exactly the trained one (no second sanitize shift)."""
    from mlx_lm.utils import load_model

    loaded, _ = load_model(model_dir)
    tokens = mx.array(valid[None, :SEQ_LEN])
    if not mx.array_equal(loaded(tokens), model(tokens)):
        raise SystemExit(f"error: `{model_dir}` loads to a model whose logits differ from the trained one")
    log(f"target: mlx_lm.utils.load_model({model_dir}) gives the trained model's logits exactly")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.demo.train", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="writes OUT/target and OUT/mtp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-steps", type=int, default=700)
    parser.add_argument("--head-steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--head-lr", type=float, default=1e-3)
    parser.add_argument("--head-only", action="store_true", help="keep OUT/target, (re)train only OUT/mtp")
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    encoded = token_stream()
    train, valid = split_docs(encoded, np.random.default_rng(args.seed))
    log(f"data: {len(encoded)} documents, {len(train):,} training and {len(valid):,} validation tokens "
        f"({time.monotonic() - t0:.0f}s)")

    text_config = qwen3_5_text_config(**TARGET)
    if args.head_only:
        from mlx_lm.utils import load_model

        target, _ = load_model(args.out / "target")
        text_config = target.args.text_config
        (val,) = evaluate(lambda w: target_loss(target, w), valid, SEQ_LEN + 1)
        log(f"target: loaded from {args.out / 'target'}, validation loss {val:.3f}")
    else:
        target = train_target(text_config, train, valid, steps=args.target_steps, lr=args.lr, seed=args.seed)
        log(f"wrote {save_model_dir(target, qwen3_5_config(text_config), args.out / 'target')}")
        check_reload(target, args.out / "target", valid)
    head, config = train_head(target, text_config, train, valid, steps=args.head_steps, lr=args.head_lr,
                              seed=args.seed + 1)
    log(f"wrote {save_head_dir(head, config, args.out / 'mtp')}")
    if not args.head_only:  # a target loaded for --head-only is extended already, and its head with it
        try:
            done = extend(args.out, seed=args.seed)
        except ExtendError as e:
            return print_error(e)
        log(f"extended to vocabulary {done['vocab_size']}, context {done['context']}; greedy text unchanged, "
            f"marker logits at least {done['margin']:.2f} below the winning one")
    log(f"done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
