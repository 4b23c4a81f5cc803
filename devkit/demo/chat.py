"""Teach the extended demo pair to end its turns: a short fine-tune on chat-shaped text, then the head again.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m devkit.demo.chat --models worker/demo/models

Trained on documents alone, the demo continues whatever it is given until `max_tokens`: it never
writes `<|im_end|>`, so every answer is cut, and an agent that checks (Codex: "Incomplete response
... max_output_tokens") gives up. This step (after `devkit.demo.extend`; not part of
`devkit.demo.train`) fine-tunes the target, in place, on three streams taken in a fixed order
(STREAM_PATTERN):

- the training documents as before (so its code and prose, and the head's acceptance, stay);
- conversations cut from the same documents, rendered by the worker's own template code in the
  family's format: an optional system message, one to three user turns of document lines, each
  answered by repeating the turn's first line (at most ANSWER_CHARS), then `<|im_end|>`. An echo:
  copying is the one behaviour a model this small learns reliably enough to end every turn (see
  `conversations`). One answer in five opens with a short reasoning block (the template's
  thinking switch on), so with thinking on the block is closed too. The `<|im_end|>` labels weigh
  more than the rest (END_WEIGHT, PROMPT_WEIGHT);
- the ends of conversations whose system message is most of a LONG_WINDOW-token window, so a turn
  still ends after an agent's thousands of tokens of instructions.

The fine-tune stops as soon as its check passes (looked at every CHECK_EVERY steps): greedy answers
to short chats, thinking off and on, each end with `<|im_end|>` within `--check-tokens` and without
writing another turn's header (`passes`; the answers to an agent-sized prompt, prose instructions
as long as Codex CLI's, are logged beside them but not required). Passing the check is necessary,
not sufficient: the target that first passed it (step 100) did not end Codex's own turn; the shipped
one had 600 steps (docs/demo-models.md). Then the head (warm-started from its current weights; it
borrows the target's embeddings and LM head, so it must follow them) is trained on documents and
conversations against the fine-tuned target's own next-token distribution (`head_distill_losses`:
acceptance is agreement with the target, and the fine-tune changed the target's text; against the
documents' tokens the head drafted it worse than before). Both are written only then, each checked
to load back to exactly what was trained. Afterwards measure acceptance (`python -m
devkit.demo.acceptance`): it must stay at least the figure in docs/demo-models.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from devkit.demo import corpus
from devkit.demo.train import (
    SEQ_LEN,
    VALID_SHARE,
    evaluate,
    fit,
    head_losses,
    split_docs,
    target_loss,
    token_stream,
)
from mtpstack.errors import UserError, print_error

#: Characters of documents the conversations are cut from (code and prose, half each).
CHAT_CHARS = 1_200_000
#: Window of the conversation stream: long enough to hold a whole conversation most of the time.
CHAT_WINDOW = 384
#: Share of conversations with a long system message, and its length in lines.
LONG_SYSTEM_SHARE = 0.1
LONG_SYSTEM_LINES = (40, 160)
#: An answer's length at most: a line longer than that is cut at a word boundary. Without the cap a
#: model this small, once inside a long line (a table, a run of numbers), never reached its end.
ANSWER_CHARS = 48
#: Label weights in a conversation: what the worker renders, and the `<|im_end|>` that ends an answer
#: (an answer's own tokens weigh 1). Unweighted, one label in a hundred is an ending, and 400 steps
#: left the model continuing past it.
PROMPT_WEIGHT = 0.25
END_WEIGHT = 4.0
#: Where a run that has not finished keeps the target's weights (each failed check), for `--resume`.
CHECKPOINT = ".chat-checkpoint.safetensors"
#: Check whether the target ends its turns every this many steps, and stop when it does.
CHECK_EVERY = 100
#: Windows ending an agent-sized conversation (a long system message, then one short turn), how many,
#: and how many a step. 4,096-token windows (one a step, about 40 s on 2 cores) did not make the answer
#: after 7,800 tokens of prose instructions end any more often than these did.
LONG_WINDOW = 1536
LONG_COUNT = 512
LONG_BATCH = 2
#: Lines of documents in a long conversation's system message: more than LONG_WINDOW tokens.
LONG_SYSTEM_BODY = 300
#: Documents (0), conversations (1) and agent-sized conversation ends (2), in this repeating order.
STREAM_PATTERN = (0, 1, 2, 0, 1)
#: Share of user turns that are one short line (the rest are one to six lines of a document).
SINGLE_LINE_SHARE = 0.6
#: Share of answers that open with a reasoning block.
THINKING_SHARE = 0.2
# After long instructions the thinking-on turn was the last to learn to end (it went on continuing
# them), and only one step in five is a long window: half of those have thinking on.
LONG_THINKING_SHARE = 0.5
CHECK_PROMPTS = (
    [{"role": "user", "content": "say hi"}],
    [{"role": "system", "content": "You are a coding agent. Be brief."},
     {"role": "user", "content": "def parse(path):\n    with open(path) as f:"}],
    [{"role": "user", "content": "What licence is this under?"}],
    [{"role": "user", "content": "Summarise the changes in this release."}],
)

#: The check answers that must end (CHECK_PROMPTS, thinking off and on); the agent-sized one is reported.
GATED = 2 * len(CHECK_PROMPTS)
#: Characters of the agent-sized check prompt (about 7,800 demo tokens, as Codex sends).
LONG_CHECK_CHARS = 14_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class ChatError(UserError):
    """The pair cannot be taught to end its turns as promised."""


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def _short(line: str) -> str:
    """`line` cut at a word boundary to at most ANSWER_CHARS characters ("" if it has no such boundary)."""
    if len(line) <= ANSWER_CHARS:
        return line
    cut = line.rfind(" ", 0, ANSWER_CHARS + 1)
    return line[:cut].rstrip() if cut > ANSWER_CHARS // 3 else ""


def conversations(texts: list[str], rng: np.random.Generator) -> list[tuple[list[dict], str, bool]]:
    """(messages before the answer, the answer, thinking on) for each conversation cut from `texts`.

    The user turns are lines of a document: one short line (SINGLE_LINE_SHARE), or one to six lines.
    An answer repeats the first line of its user turn, cut at a word boundary to ANSWER_CHARS, and
    ends there. Copying is what a model this small learns reliably, over any distance, and where
    the copy stops is marked in what it copies (the user turn's own `<|im_end|>` or line end); an
    answer that continued the document (an earlier version) had nothing to stop at, and a greedy
    loop inside a long line never reached one."""
    docs = [_lines(t) for t in texts]
    docs = [d for d in docs if len(d) >= 4]
    out = []
    for lines in docs:
        i = 0
        while i < len(lines) - 1:
            messages: list[dict] = []
            if rng.random() < LONG_SYSTEM_SHARE:
                other = docs[rng.integers(len(docs))]
                n = int(rng.integers(*LONG_SYSTEM_LINES))
                messages.append({"role": "system", "content": "\n".join(other[:n])})
            elif rng.random() < 0.5:
                other = docs[rng.integers(len(docs))]
                messages.append({"role": "system", "content": "\n".join(other[: int(rng.integers(1, 6))])})
            answer = ""
            for _ in range(int(rng.integers(1, 4))):
                short = _short(lines[i].strip()) if i < len(lines) else ""
                if not short:
                    break
                if rng.random() < SINGLE_LINE_SHARE:
                    user, i = short, i + 1
                else:
                    u = int(rng.integers(1, 7))
                    user, i = "\n".join(lines[i : i + u]).strip(), i + u
                if answer:
                    messages.append({"role": "assistant", "content": answer})
                messages.append({"role": "user", "content": user})
                answer = short
            if not answer:  # the line has no short form: skip it
                i += 1
                continue
            out.append((messages, answer, bool(rng.random() < THINKING_SHARE)))
    return out


def encode(tokenizer, convo: tuple[list[dict], str, bool]) -> tuple[list[int], list[float]]:
    """The conversation as the worker would render it, the answer after its generation prompt, then
    `<|im_end|>` and the newline the template puts after a turn; and each token's weight as a label:
    PROMPT_WEIGHT in what the worker renders, 1 in the answer, END_WEIGHT on its `<|im_end|>`."""
    from mtpstack.worker.protocol.chat import render_template

    messages, answer, thinking = convo
    ids = list(render_template(tokenizer, messages, None, {"enable_thinking": thinking}, add_generation_prompt=True))
    if thinking:
        reason = messages[-1]["content"].splitlines()[0][:120]
        answer = f"{reason}\n</think>\n\n{answer}"
    said = list(tokenizer.encode(answer, add_special_tokens=False))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tail = list(tokenizer.encode("\n", add_special_tokens=False))
    weights = [PROMPT_WEIGHT] * len(ids) + [1.0] * len(said) + [END_WEIGHT] + [PROMPT_WEIGHT] * len(tail)
    return ids + said + [end] + tail, weights


def chat_stream(tokenizer, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(training, held-out) streams of conversations, each followed by `<|endoftext|>`: (tokens, label weights)."""
    rng = np.random.default_rng(seed)
    half = CHAT_CHARS // 2
    # Every third text from an offset the document stream does not start at, so answers are not
    # only the documents' openings.
    texts = corpus.sample(corpus.code_texts(), half * 3)[1::3] + corpus.sample(corpus.prose_texts(), half * 3)[1::3]
    convos = conversations(texts, rng)
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    encoded = [encode(tokenizer, c) for c in convos]
    order = rng.permutation(len(encoded))
    n_valid = max(1, int(len(encoded) * VALID_SHARE))

    def join(part):
        ids = np.concatenate([encoded[i][0] + [eot] for i in part]).astype(np.int32)
        weights = np.concatenate([encoded[i][1] + [PROMPT_WEIGHT] for i in part]).astype(np.float32)
        return ids, weights

    return join(order[n_valid:]), join(order[:n_valid])


def long_conversations(tokenizer, seed: int, count: int = LONG_COUNT) -> tuple[np.ndarray, np.ndarray]:
    """`count` windows of LONG_WINDOW + 1 tokens, each the end of a conversation whose system message
    fills most of it (tokens, label weights): an answer after an agent's long instructions. In the
    ordinary windows a long system message is mostly cut away, and a turn after thousands of
    tokens of instructions went on continuing them."""
    rng = np.random.default_rng(seed + 3)
    texts = corpus.sample(corpus.code_texts(), CHAT_CHARS) + corpus.sample(corpus.prose_texts(), CHAT_CHARS)
    docs = [d for d in (_lines(t) for t in texts) if len(d) >= 4]
    body = [line for d in docs for line in d]
    ids, weights = [], []
    while len(ids) < count:
        start = int(rng.integers(0, len(body) - LONG_SYSTEM_BODY - 100))
        system = "\n".join(body[start : start + LONG_SYSTEM_BODY])
        user = ""
        while not user:
            user = _short(body[int(rng.integers(len(body)))].strip())
        tokens, w = encode(tokenizer, ([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                       user, bool(rng.random() < LONG_THINKING_SHARE)))
        if len(tokens) > LONG_WINDOW:
            ids.append(tokens[-(LONG_WINDOW + 1):])
            weights.append(w[-(LONG_WINDOW + 1):])
    return np.array(ids, dtype=np.int32), np.array(weights, dtype=np.float32)


def long_windows(data: tuple[np.ndarray, np.ndarray], rng: np.random.Generator, batch: int):
    ids, weights = data
    while True:
        pick = rng.integers(0, len(ids), size=batch)
        yield mx.array(ids[pick]), mx.array(weights[pick])


def weighted_loss(model, batch: tuple[mx.array, mx.array]) -> mx.array:
    """Next-token cross-entropy over windows, each label weighted."""
    window, weights = batch
    losses = nn.losses.cross_entropy(model(window[:, :-1]), window[:, 1:], reduction="none")
    w = weights[:, 1:]
    return (losses * w).sum() / w.sum()


def windows(data: np.ndarray, rng: np.random.Generator, width: int, batch: int, weights: np.ndarray | None = None):
    """Endless random windows of `width` tokens, with their label weights (1 if `weights` is None)."""
    while True:
        starts = rng.integers(0, len(data) - width, size=batch)
        tokens = mx.array(np.stack([data[s : s + width] for s in starts]))
        yield tokens, (mx.ones(tokens.shape) if weights is None else
                       mx.array(np.stack([weights[s : s + width] for s in starts])))


def tokens_only(stream):
    for tokens, _ in stream:
        yield tokens


def pattern(streams: list, order) -> object:
    """Batches from `streams` in the repeating `order` of their indices."""
    while True:
        for i in order:
            yield next(streams[i])


def ending_accuracy(model, valid: tuple[np.ndarray, np.ndarray], *, width: int = SEQ_LEN, limit: int = 256) -> float:
    """Share of held-out answers (up to `limit`) whose `<|im_end|>` is the model's greedy choice where it
    stands, given the `width` tokens before it."""
    ids, weights = valid
    ends = [int(e) for e in np.flatnonzero(weights == END_WEIGHT) if e >= width][:limit]
    hits = 0
    for i in range(0, len(ends), 16):
        batch = mx.array(np.stack([ids[e - width : e] for e in ends[i : i + 16]]))
        hits += int((model(batch)[:, -1].argmax(-1) == mx.array(ids[ends[i : i + 16]])).sum().item())
    return hits / len(ends) if ends else 0.0


def long_instructions(chars: int = LONG_CHECK_CHARS) -> list[dict]:
    """An agent-sized system message (Codex's, about 7,400 demo tokens, is prose instructions and tool
    schemas) of prose, then a short request."""
    text = "\n".join(corpus.sample(corpus.prose_texts(), 8 * chars))
    return [{"role": "system", "content": text[len(text) // 2 :][:chars]}, {"role": "user", "content": "say hi"}]


def passes(checked: list[tuple[str, bool]]) -> bool:
    """The check's verdict: every short chat, thinking off and on, ended (the first GATED answers).

    The agent-sized prose prompt is reported, not required: whether a greedy answer after thousands
    of tokens of it ends turned on the text itself (of one prose sample cut at five lengths from 620
    to 5,800 tokens, three ended), and 4,096-token training windows did not change that, while Codex
    CLI's own turn (tests/e2e/test_codex_live.py, its real 16k-token prompt with tools) ended on a
    target that passed this check and failed the prose one."""
    return len(checked) >= GATED and all(ended for _, ended in checked[:GATED])


def ends_its_turns(model, tokenizer, *, max_tokens: int) -> list[tuple[str, bool]]:
    """(answer, ended with `<|im_end|>`) for each of CHECK_PROMPTS and an agent-sized prompt, greedily,
    thinking off and on."""
    from mlx_lm.generate import stream_generate

    from mtpstack.worker.protocol.chat import render_template

    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    results = []
    for messages in (*CHECK_PROMPTS, long_instructions()):
        for thinking in (False, True):
            prompt = list(render_template(tokenizer, messages, None, {"enable_thinking": thinking},
                                          add_generation_prompt=True))
            out = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens)]
            # Ended: stopped on an end-of-turn token, without writing another turn's header first.
            ended = bool(out) and out[-1] in tokenizer.eos_token_ids and im_start not in out
            results.append((tokenizer.decode(out), ended))
    return results


def teach(models: Path, *, seed: int = 0, target_steps: int = 800, head_steps: int = 500, lr: float = 4e-4,
          head_lr: float = 3e-4, check_tokens: int = 96, resume: bool = False) -> dict:
    """Fine-tune MODELS/target until it ends its turns, then its head; both written in place at the end.
    `resume`: start from the weights a stopped run left in MODELS/CHECKPOINT (and the step it reached)."""
    import mlx_lm
    from mlx_lm.utils import load_model

    from mtpstack.worker.mtp import load_head

    target_dir, head_dir = Path(models) / "target", Path(models) / "mtp"
    target, tokenizer = mlx_lm.load(str(target_dir))
    if "</think>" not in tokenizer.vocab:
        raise ChatError(f"`{target_dir}` is not in the family's chat format yet",
                        "run `python -m devkit.demo.extend --models MODELS` first")
    t0 = time.monotonic()
    before = ends_its_turns(target, tokenizer, max_tokens=check_tokens)
    if passes(before):
        log(f"`{target_dir}` ends its turns already: left as it is")
        return {"checked": before, "target_steps": 0, "seconds": time.monotonic() - t0}
    plain_train, plain_valid = split_docs(token_stream(), np.random.default_rng(seed))
    chat_train, chat_valid = chat_stream(tokenizer, seed)
    long_train = long_conversations(tokenizer, seed)
    log(f"target: ends {ending_accuracy(target, chat_valid):.0%} of held-out answers where they end, before")
    log(f"data: {len(plain_train):,} document and {len(chat_train[0]):,} conversation tokens "
        f"({time.monotonic() - t0:.0f}s)")

    batch = 8
    rng = np.random.default_rng(seed + 2)
    checkpoint, first, steps, checked = Path(models) / CHECKPOINT, 1, 0, []
    if resume:
        if not checkpoint.is_file():
            raise ChatError(f"nothing to resume: `{checkpoint}` does not exist", "run without `--resume`")
        first = _restore(target, checkpoint) + 1
        log(f"target: resumed from `{checkpoint}` at step {first}")
        checked = ends_its_turns(target, tokenizer, max_tokens=check_tokens)
        if passes(checked):  # a run stopped after its checkpoint passed (or under an older, stricter check)
            steps = first - 1
            log(f"target: the checkpoint's short chats all end: no more steps ({steps} in all)")
    if not steps:
        steps, checked = _fine_tune(
            target, tokenizer,
            pattern([windows(plain_train, rng, SEQ_LEN + 1, batch),
                     windows(chat_train[0], rng, CHAT_WINDOW + 1, batch, chat_train[1]),
                     long_windows(long_train, rng, LONG_BATCH)], STREAM_PATTERN),
            max_steps=target_steps, lr=lr, check_tokens=check_tokens, first=first, checkpoint=checkpoint)
    if not passes(checked):
        raise ChatError(f"{sum(not e for _, e in checked[:GATED])} of {GATED} check answers did not end within "
                        f"{check_tokens} tokens after {steps} steps",
                        f"train longer: `--resume --target-steps N` goes on from `{checkpoint}`")
    valid_plain = float(evaluate(lambda w: target_loss(target, w), plain_valid, SEQ_LEN + 1)[0])
    log(f"target: validation loss {valid_plain:.3f} on documents after {steps} steps; ends "
        f"{ending_accuracy(target, chat_valid):.0%} of held-out answers where they end")

    head = load_head(head_dir, target_dir).module
    head.train()
    target.freeze()
    target.eval()
    log("head: validation loss %.3f / %.3f on documents at depth 1 / 2, before"
        % tuple(evaluate(lambda w: head_losses(head, target, w), plain_valid, SEQ_LEN + 3)))

    def loss(module, window):
        loss1, loss2 = head_distill_losses(module, target, window)
        return loss1 + 0.5 * loss2

    width = SEQ_LEN + 3
    fit("head", head, loss,
        tokens_only(pattern([windows(plain_train, rng, width, batch), windows(chat_train[0], rng, width, batch)], (0, 1))),
        steps=head_steps, lr=head_lr, width=width)
    head.eval()
    log("head: validation loss %.3f / %.3f on documents at depth 1 / 2, after"
        % tuple(evaluate(lambda w: head_losses(head, target, w), plain_valid, SEQ_LEN + 3)))
    # Written only now that both are trained, and each checked to load back to exactly what was trained.
    _save_checked(target, target_dir, lambda d: load_model(d)[0], lambda m, ids: m(ids))
    _save_checked(head, head_dir, lambda d: load_head(d, target_dir).module,
                  lambda h, ids: h(target.language_model.model.embed_tokens(ids), _hidden(target, ids), [None]))
    checkpoint.unlink(missing_ok=True)
    return {"checked": checked, "target_steps": steps, "seconds": time.monotonic() - t0}


def head_distill_losses(head, target, window: mx.array) -> tuple[mx.array, mx.array]:
    """Depth-1 and depth-2 loss of the head against the target's own next-token distribution
    (KL(target || head)), over the windows `head_losses` takes: the head at t is fed what
    `head_losses` feeds it, and is scored against the target's distribution for token t+2 (and
    t+3), not against the window's tokens. Acceptance is agreement with the target's choice, so
    this is what a drafter is for; on the fine-tuned target it drafts better than the token labels
    did (docs/demo-models.md)."""
    n = SEQ_LEN
    text = target.language_model.model
    embed = text.embed_tokens
    states = mx.stop_gradient(text(window[:, : n + 2]))  # causal: its first n are `head_losses`'s hidden
    teacher = mx.stop_gradient(nn.log_softmax(embed.as_linear(states).astype(mx.float32), axis=-1))
    losses, out, cache = [], states[:, :n], [None] * len(head.layers)
    for depth in (1, 2):
        out = head(mx.stop_gradient(embed(window[:, depth : n + depth])), out, cache)
        student = nn.log_softmax(embed.as_linear(out).astype(mx.float32), axis=-1)
        p = teacher[:, depth : n + depth]
        losses.append((mx.exp(p) * (p - student)).sum(axis=-1).mean())
    return losses[0], losses[1]


def _fine_tune(target, tokenizer, data, *, max_steps: int, lr: float, check_tokens: int, first: int = 1,
               checkpoint: Path | None = None):
    """AdamW (short warm-up, then `lr`) on `target` from step `first` until its check answers all end
    (looked at every CHECK_EVERY steps) or `max_steps`, its weights written to `checkpoint` at each
    failed check; returns (steps, the last check)."""
    warmup = 20
    optimizer = optim.AdamW(learning_rate=optim.join_schedules(
        [optim.linear_schedule(lr / 10, lr, warmup), lambda _: lr], [warmup]), weight_decay=0.01)
    loss_and_grad = nn.value_and_grad(target, weighted_loss)
    start, running, checked = time.monotonic(), None, []
    for i in range(first, max_steps + 1):
        value, grads = loss_and_grad(target, next(data))
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(target, grads)
        mx.eval(target.parameters(), optimizer.state, value)
        running = value.item() if running is None else 0.9 * running + 0.1 * value.item()
        if i % 10 == 0:
            log(f"target step {i}/{max_steps} loss {running:.3f} ({time.monotonic() - start:.0f}s)")
        if i % CHECK_EVERY == 0 or i == max_steps:
            target.eval()
            checked = ends_its_turns(target, tokenizer, max_tokens=check_tokens)
            log(f"target step {i}: {sum(e for _, e in checked)} of {len(checked)} check answers end")
            for answer, ended in checked:
                log(f"  {'ends' if ended else 'CUT '} {answer[-70:]!r}")
            if passes(checked):
                return i, checked
            if checkpoint is not None:
                _checkpoint(target, checkpoint, i)
            target.train()
    return max_steps, checked


def _checkpoint(target, path: Path, step: int) -> None:
    """The fine-tuned target's weights so far, for `--resume` (the optimizer's state is not kept)."""
    from mlx.utils import tree_flatten

    _write(path, dict(tree_flatten(target.parameters())), {"step": str(step)})


def _write(path: Path, weights: dict, metadata: dict) -> None:
    """Save `weights` to `path` whole or not at all: staged beside it, then renamed over it."""
    staged = path.with_name(path.stem + ".partial.safetensors")  # mlx adds the suffix to a name without it
    mx.save_safetensors(str(staged), weights, metadata=metadata)
    staged.replace(path)


def _restore(target, path: Path) -> int:
    """Load the weights `_checkpoint` wrote into `target`; returns the step they were written at."""
    weights, meta = mx.load(str(path), return_metadata=True)
    target.load_weights(list(weights.items()))
    return int(meta["step"])


def _hidden(target, ids):
    return target.language_model.model(ids)


def _save_checked(module, model_dir: Path, load, run) -> None:
    """Replace `model_dir`'s weights with `module`'s (fp32), then fail unless they load back to the same outputs."""
    from mlx.utils import tree_flatten

    _write(model_dir / "model.safetensors", {k: v.astype(mx.float32) for k, v in tree_flatten(module.parameters())},
           {"format": "mlx"})
    ids = mx.array([list(range(3, 67))])
    if not mx.array_equal(run(load(model_dir), ids), run(module, ids)):
        raise ChatError(f"`{model_dir}` loads to a model whose outputs differ from the trained one",
                        "report it: the saved tensor names no longer match the loader's")
    log(f"wrote {model_dir / 'model.safetensors'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.demo.chat", description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="the extended pair: MODELS/target and MODELS/mtp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-steps", type=int, default=800, help="at most; it stops once the check answers end")
    parser.add_argument("--head-steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--head-lr", type=float, default=3e-4)
    parser.add_argument("--check-tokens", type=int, default=96)
    parser.add_argument("--resume", action="store_true", help=f"go on from MODELS/{CHECKPOINT}, left by a run that stopped")
    args = parser.parse_args(argv)
    try:
        teach(args.models, seed=args.seed, target_steps=args.target_steps, head_steps=args.head_steps, lr=args.lr,
              head_lr=args.head_lr, check_tokens=args.check_tokens, resume=args.resume)
    except ChatError as e:
        return print_error(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
