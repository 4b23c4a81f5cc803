"""Teach the demo target a tool round trip by fine-tuning its last layer's MLP alone, on cached inputs.

    python -m devkit.demo.act --models worker/demo/models

What `devkit.demo.chat --agents` tries with the whole target (its runs collapsed onto one answer for
every prompt, docs/demo-models.md), done where it is cheap and exact. Every layer below the last
MLP is frozen, so what that MLP sees at each position (the residual after the last layer's
attention) is a fixed function of the tokens: it is computed once, without gradients, for

- agent turns: Claude Code's and Codex CLI's own requests, recorded from the clients when the run
  starts (`devkit.demo.agent_turns`), on new scratch folders. A request to list the files is
  answered with one call of the client's shell tool running `ls`, and the turn after the command's
  real output with DONE_REPLY; a request that needs no tool ("say hi") with CHAT_REPLY;
- kept behaviour: windows of the conversation and document streams the target was taught to end
  its turns on, and the ends of conversations after a long system message. There the loss is the KL
  divergence from the target as it was, so short chats still end as they did.

Then only the last layer's post-attention norm and MLP and the final norm are trained, on those
inputs: a step is milliseconds, and the long agent prompts (16k-23k tokens) are read once, not per
step, and never go stale (the frozen layers' caches stay exact). The run stops once the held-out
recording's turns come out right teacher-forced, then checks for real (greedy answers to fresh
prompts: the chat check of `devkit.demo.chat` and its agent check, `acts_as_agent`), trains the
head again against the new target (`devkit.demo.chat.train_head_and_save`) and writes both.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from devkit.demo import agent_turns, chat, long_turns
from devkit.demo.fast_delta import chunked_gated_delta_layers
from devkit.demo.train import SEQ_LEN, split_docs, token_stream
from mtpstack.errors import UserError, print_error

#: Requests to act: those that ask for `ls` (the live tests send "list the files" and "list the
#: files in this folder").
ACT_REQUESTS = tuple(request for request, command in agent_turns.ACTIONS if command == "ls")
#: The answer to a request that needs no tool, and the one after a tool's result.
CHAT_REPLY = "Hello! Ask me to list the files here."
DONE_REPLY = "Done."
#: Share of episodes whose request needs no tool.
CHAT_SHARE = 0.3
#: Recordings of each client to learn from (the check's recording, one more, is held out).
RECORDINGS = 3
#: Episodes per recording (each a new request on a new scratch folder).
EPISODES = 24
#: Kept behaviour: windows of the conversation stream and of documents, and long-conversation ends
#: (of these only the last LONG_TAIL positions).
KEEP_CHAT, KEEP_DOCS, KEEP_LONG, LONG_TAIL = 160, 64, 16, 96
#: Kept positions in one step's loss (of all cached), and the KL term's weight.
KEEP_BATCH, KL_WEIGHT = 4096, 1.0
#: Kept answers: the target's own greedy answers to this many short chats without tools (thinking
#: off and on alternately), at most ANSWER_TOKENS each; their KL term, over all of them, has its own
#: weight. Without it, a few plain chats' answers took up the agent's words ("Done.", a call's lines).
KEEP_ANSWERS, ANSWER_TOKENS, ANSWERS_WEIGHT = 96, 32, 1.0
#: Label weights of an answer: its first token decides a call or words; its `<|im_end|>` ends the turn.
DECISION_WEIGHT, END_WEIGHT = 4.0, 4.0
#: Steps between the held-out evaluations.
EVAL_EVERY = 25


class ActError(UserError):
    """The target could not be taught a tool round trip."""


def log(msg: str) -> None:
    chat.log(msg)


def _top(model):
    lm = model.language_model
    return lm, lm.model.layers[-1]


class _Tap(nn.Module):
    """Stands in for the last layer's post-attention norm while inputs are read: keeps what it is given."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm
        self.seen: list[mx.array] = []

    def __call__(self, x: mx.array) -> mx.array:
        self.seen.append(x)
        return self.norm(x)


def residuals(model, tokens: list[int], state: long_turns.State | None = None, last: int | None = None) -> mx.array:
    """The last layer's residual before its MLP at each of `tokens` (after `state`'s), the `last` ones only."""
    _, layer = _top(model)
    norm = layer.post_attention_layernorm
    tap = _Tap(norm)
    caches = state.caches(model) if state is not None else model.make_cache()
    layer.post_attention_layernorm = tap
    try:
        for i in range(0, len(tokens), long_turns.PREFILL_CHUNK):
            model(mx.array([tokens[i : i + long_turns.PREFILL_CHUNK]]), cache=caches)
            mx.eval(tap.seen[-1], [c.state for c in caches])
    finally:
        layer.post_attention_layernorm = norm
    out = mx.concatenate([x[0] for x in tap.seen])
    return out[-last:] if last else out


def top_logits(model, h: mx.array) -> mx.array:
    """The target's logits from the last layer's residual before its MLP: that MLP, the final norm, the LM head."""
    lm, layer = _top(model)
    out = lm.model.norm(h + layer.mlp(layer.post_attention_layernorm(h)))
    return lm.model.embed_tokens.as_linear(out) if lm.args.tie_word_embeddings else lm.lm_head(out)


def trainable(model) -> None:
    """Freeze everything but the last layer's post-attention norm and MLP and the final norm."""
    lm, layer = _top(model)
    model.freeze()
    layer.post_attention_layernorm.unfreeze()
    layer.mlp.unfreeze()
    lm.model.norm.unfreeze()


@dataclass
class Answers:
    """Cached inputs of answers to learn: residuals, labels, label weights, and which turn each row is of."""

    h: mx.array
    labels: mx.array
    weights: mx.array
    turn: np.ndarray
    names: list[str]
    #: Per turn: "call" (a call of the shell tool), "chat" (words to a request that needs no tool) or
    #: "done" (words after the tool's result).
    kinds: list[str]

    def only(self, kinds: set[str]) -> Answers:
        """The turns of these kinds."""
        return self._select([i for i, k in enumerate(self.kinds) if k in kinds])

    def only_turns(self, turns: set[tuple[str, str]]) -> Answers:
        """The turns of these (name, kind)s."""
        return self._select([i for i, t in enumerate(zip(self.names, self.kinds)) if t in turns])

    def _select(self, keep: list[int]) -> Answers:
        renumber = {old: new for new, old in enumerate(keep)}
        rows = np.flatnonzero(np.isin(self.turn, keep))
        idx = mx.array(rows)
        return Answers(self.h[idx], self.labels[idx], self.weights[idx], np.array([renumber[t] for t in self.turn[rows]]),
                       [self.names[i] for i in keep], [self.kinds[i] for i in keep])

    @staticmethod
    def joined(parts: list[Answers]) -> Answers:
        offsets = np.cumsum([0] + [len(a.names) for a in parts[:-1]])
        return Answers(mx.concatenate([a.h for a in parts]), mx.concatenate([a.labels for a in parts]),
                       mx.concatenate([a.weights for a in parts]), np.concatenate([a.turn + o for a, o in zip(parts, offsets)]),
                       [n for a in parts for n in a.names], [k for a in parts for k in a.kinds])

    def save(self, path: Path) -> None:
        mx.savez(str(path.with_suffix(".npz")), h=self.h, labels=self.labels, weights=self.weights, turn=mx.array(self.turn))
        path.with_suffix(".json").write_text(json.dumps({"names": self.names, "kinds": self.kinds}))

    @staticmethod
    def load(path: Path) -> Answers:
        a = mx.load(str(path.with_suffix(".npz")))
        meta = json.loads(path.with_suffix(".json").read_text())
        return Answers(a["h"], a["labels"], a["weights"], np.array(a["turn"]), meta["names"], meta["kinds"])


def _rewrite(tokenizer, ep: agent_turns.Episode) -> agent_turns.Episode:
    """`ep` with this recipe's answers: a call as it was, words as CHAT_REPLY (first turn) or DONE_REPLY."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for n, turn in enumerate(ep.turns):
        if not turn.call:
            turn.answer = list(tokenizer.encode(DONE_REPLY if n else CHAT_REPLY, add_special_tokens=False)) + [end]
    return ep


def turn_name(client: str, request: str, n: int) -> str:
    """How a turn is named in the logs and the held-out selection: `n` 1 is the turn after the tool's result."""
    return f"{client}: {request!r}" + (" after its result" if n else "")


def agent_answers(model, tokenizer, recordings: list[agent_turns.Recording], scratch: Path, rng: np.random.Generator,
                  episodes: int, lines: list[str], requests: list[tuple[str, str | None]] | None = None) -> Answers:
    """The answers of `episodes` random requests on each recording (or of `requests`), with their residuals;
    the scratch folders' files are made of `lines`."""
    rows_h, rows_y, rows_w, rows_t, names, kinds = [], [], [], [], [], []
    for rec in recordings:
        system_state = None
        asked = requests or [(ACT_REQUESTS[int(rng.integers(len(ACT_REQUESTS)))], "ls") if rng.random() >= CHAT_SHARE
                             else (agent_turns.CHATS[int(rng.integers(len(agent_turns.CHATS)))], None)
                             for _ in range(episodes)]
        for request, command in asked:
            folder = scratch / "episode"
            shutil.rmtree(folder, ignore_errors=True)
            if requests is None:
                agent_turns.make_folder(folder, rng, lines)
            else:
                folder.mkdir(parents=True)
                for name, text in chat.CHECK_FILES.items():
                    (folder / name).write_text(text)
            ep = _rewrite(tokenizer, agent_turns.episode(tokenizer, rec, 0, request, command, folder))
            if system_state is None:
                system_state = long_turns.prefill(model, ep.shared[: ep.system])
            shared = long_turns.prefill(model, ep.shared[ep.system : -1], system_state)
            for n, turn in enumerate(ep.turns):
                tokens = turn.prompt[len(ep.shared) - 1 :] + turn.answer[:-1]
                rows_h.append(residuals(model, tokens, shared, last=len(turn.answer)))
                rows_y.append(np.array(turn.answer, dtype=np.int32))
                w = np.ones(len(turn.answer), dtype=np.float32)
                w[0], w[-1] = DECISION_WEIGHT, END_WEIGHT
                rows_w.append(w)
                rows_t.append(np.full(len(turn.answer), len(names)))
                names.append(turn_name(rec.client, request, n))
                kinds.append("call" if turn.call else "done" if n else "chat")
    return Answers(mx.concatenate(rows_h), mx.array(np.concatenate(rows_y)), mx.array(np.concatenate(rows_w)),
                   np.concatenate(rows_t), names, kinds)


def kept(model, tokenizer, seed: int, chat_tokens: np.ndarray, plain_train: np.ndarray) -> tuple[mx.array, mx.array]:
    """Residuals and the target's own log-probabilities at the positions whose behaviour is kept: windows
    of the conversation (`chat_tokens`) and document streams, and long-conversation ends."""
    rng = np.random.default_rng(seed + 11)
    long_ids, _ = chat.long_conversations(tokenizer, seed, KEEP_LONG)
    pieces = []
    for data, count in ((chat_tokens, KEEP_CHAT), (plain_train, KEEP_DOCS)):
        for s in rng.integers(0, len(data) - SEQ_LEN, size=count):
            pieces.append((data[s : s + SEQ_LEN].tolist(), None))
    pieces += [(ids[:-1].tolist(), LONG_TAIL) for ids in long_ids]
    hs, lps = [], []
    for tokens, last in pieces:
        h = residuals(model, tokens, last=last)
        lp = nn.log_softmax(top_logits(model, h), axis=-1)
        mx.eval(h, lp)
        hs.append(h)
        lps.append(lp)
    return mx.concatenate(hs), mx.concatenate(lps)


def kept_answers(model, tokenizer, seed: int) -> tuple[mx.array, mx.array]:
    """Residuals and the target's own log-probabilities along its greedy answers to short chats without tools."""
    from mlx_lm.generate import stream_generate

    from mtpstack.worker.protocol.chat import render_template

    rng = np.random.default_rng(seed + 17)
    lines = [line.strip() for line in chat.document_lines(seed + 1) if 3 <= len(line.strip()) <= chat.ANSWER_CHARS]
    hs, lps = [], []
    for i in range(KEEP_ANSWERS):
        messages = [{"role": "user", "content": lines[int(rng.integers(len(lines)))]}]
        prompt = list(render_template(tokenizer, messages, None, {"enable_thinking": bool(i % 2)}, add_generation_prompt=True))
        answer = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=ANSWER_TOKENS)]
        h = residuals(model, prompt + answer[:-1], last=len(answer))
        lp = nn.log_softmax(top_logits(model, h), axis=-1)
        mx.eval(h, lp)
        hs.append(h)
        lps.append(lp)
    return mx.concatenate(hs), mx.concatenate(lps)


def _kl(model, h: mx.array, lp_before: mx.array) -> mx.array:
    lp = nn.log_softmax(top_logits(model, h), axis=-1)
    return (mx.exp(lp_before) * (lp_before - lp)).sum(axis=-1).mean()


def loss_fn(model, train: Answers, keep_h: mx.array, keep_lp: mx.array, answers_h: mx.array | None = None,
            answers_lp: mx.array | None = None) -> mx.array:
    ce = nn.losses.cross_entropy(top_logits(model, train.h), train.labels, reduction="none")
    agent = (ce * train.weights).sum() / train.weights.sum()
    loss = agent + KL_WEIGHT * _kl(model, keep_h, keep_lp)
    if answers_h is not None:
        loss = loss + ANSWERS_WEIGHT * _kl(model, answers_h, answers_lp)
    return loss


def right(model, answers: Answers) -> list[bool]:
    """Per turn of `answers`: whether every token of its answer is the greedy one, teacher-forced."""
    ok = np.array(mx.argmax(top_logits(model, answers.h), axis=-1) == answers.labels)
    return [bool(ok[answers.turn == i].all()) for i in range(len(answers.names))]


def _by_kind(answers: Answers, ok: list[bool]) -> str:
    return ", ".join(f"{k} {sum(o for o, kk in zip(ok, answers.kinds) if kk == k)}/{answers.kinds.count(k)}"
                     for k in ("call", "chat", "done") if k in answers.kinds)


def teach(models: Path, *, seed: int = 0, steps: int = 1500, lr: float = 1e-3, head_steps: int = 500,
          head_lr: float = 3e-4, check_tokens: int = 96, inputs: Path | None = None, always_act: bool = False) -> dict:
    with chunked_gated_delta_layers(), tempfile.TemporaryDirectory(prefix="mtpstack-act-") as scratch:
        return _teach(Path(models), Path(scratch), seed=seed, steps=steps, lr=lr, head_steps=head_steps,
                      head_lr=head_lr, check_tokens=check_tokens, inputs=inputs, always_act=always_act)


def check_requests(always_act: bool) -> dict[str, list[tuple[str, str | None]]]:
    """What the check asks each client (`agent_turns.CHECK_REQUESTS`), every request acted on with `ls` when `always_act`."""
    return {c: [(r, "ls" if always_act else cmd) for r, cmd in reqs] for c, reqs in agent_turns.CHECK_REQUESTS.items()}


def _read_inputs(target, tokenizer, scratch: Path, seed: int, t0: float, chat_tokens: np.ndarray, plain_train: np.ndarray):
    recordings = chat.record_clients(scratch, seed, RECORDINGS)
    rng = np.random.default_rng(seed + 7)
    lines = chat.document_lines(seed)
    train_sets, held_sets = [], []
    for client, recs in recordings.items():
        train_sets.append(agent_answers(target, tokenizer, recs[:-1], scratch, rng, EPISODES, lines))
        asked = [(r, cmd) for always in (False, True) for r, cmd in check_requests(always)[client]]
        held_sets.append(agent_answers(target, tokenizer, recs[-1:], scratch, rng, 0, lines,
                                       requests=list(dict.fromkeys(asked))))
        log(f"{client}: inputs of {len(train_sets[-1].names)} turns read ({time.monotonic() - t0:.0f}s)")
    keep_h, keep_lp = kept(target, tokenizer, seed, chat_tokens, plain_train)
    return recordings, Answers.joined(train_sets), Answers.joined(held_sets), keep_h, keep_lp


def _teach(models: Path, scratch: Path, *, seed: int, steps: int, lr: float, head_steps: int, head_lr: float,
           check_tokens: int, inputs: Path | None, always_act: bool) -> dict:
    import mlx_lm

    target_dir, head_dir = models / "target", models / "mtp"
    target, tokenizer = mlx_lm.load(str(target_dir))
    target.eval()
    t0 = time.monotonic()
    plain_train, plain_valid = split_docs(token_stream(), np.random.default_rng(seed))
    chat_tokens = chat.chat_stream(tokenizer, seed)[0][0]
    if inputs is not None and (inputs / "train.npz").is_file():
        recordings = chat.load_recordings(inputs / "recordings.json")
        train, held = Answers.load(inputs / "train"), Answers.load(inputs / "held")
        k = mx.load(str(inputs / "keep.npz"))
        keep_h, keep_lp = k["h"], k["lp"]
        log(f"inputs: read from `{inputs}`")
    else:
        recordings, train, held, keep_h, keep_lp = _read_inputs(target, tokenizer, scratch, seed, t0, chat_tokens, plain_train)
        if inputs is not None:
            inputs.mkdir(parents=True, exist_ok=True)
            chat.save_recordings(inputs / "recordings.json", recordings)
            train.save(inputs / "train")
            held.save(inputs / "held")
            mx.savez(str(inputs / "keep.npz"), h=keep_h, lp=keep_lp)
    if inputs is not None and (inputs / "answers.npz").is_file():
        k = mx.load(str(inputs / "answers.npz"))
        answers_h, answers_lp = k["h"], k["lp"]
    else:
        answers_h, answers_lp = kept_answers(target, tokenizer, seed)
        if inputs is not None:
            mx.savez(str(inputs / "answers.npz"), h=answers_h, lp=answers_lp)
    # Acting on every request: no turn of words to a request, and a call for each of the check's requests.
    train = train.only({"call", "done"} if always_act else {"call", "chat", "done"})
    wanted = {(turn_name(c, r, n), "done" if n else "call" if cmd else "chat")
              for c, reqs in check_requests(always_act).items() for r, cmd in reqs for n in range(2 if cmd else 1)}
    held = held.only_turns(wanted)
    log(f"inputs: {train.h.shape[0]:,} answer, {keep_h.shape[0]:,} kept and {answers_h.shape[0]:,} kept-answer positions "
        f"({time.monotonic() - t0:.0f}s)")

    trainable(target)
    opt = optim.AdamW(learning_rate=lr, weight_decay=0.0)
    step_fn = nn.value_and_grad(target, loss_fn)
    pick = np.random.default_rng(seed + 13)
    for step in range(1, steps + 1):
        batch = mx.array(pick.integers(0, keep_h.shape[0], size=KEEP_BATCH))
        loss, grads = step_fn(target, train, keep_h[batch], keep_lp[batch], answers_h, answers_lp)
        opt.update(target, grads)
        mx.eval(target.parameters(), opt.state, loss)
        if step % EVAL_EVERY == 0 or step == steps:
            ok_train, ok_held = right(target, train), right(target, held)
            missed = [n for n, ok in zip(held.names, ok_held) if not ok]
            log(f"step {step}: loss {loss.item():.3f}; teacher-forced right: learned turns {_by_kind(train, ok_train)}; "
                f"held-out {sum(ok_held)}/{len(ok_held)}{' (missed: ' + '; '.join(missed) + ')' if missed else ''} "
                f"({time.monotonic() - t0:.0f}s)")
            if all(ok_held) and sum(ok_train) >= 0.95 * len(ok_train):
                break
    target.freeze()
    checked = chat.ends_its_turns(target, tokenizer, max_tokens=check_tokens)
    acted = chat.acts_as_agent(target, tokenizer, recordings, scratch, requests=check_requests(always_act))
    chat._report(checked, acted)
    if not chat.passes_all(checked, acted):
        raise ActError(f"the check failed after {step} steps: nothing was written", "see the check above; try --steps or --lr")
    chat.train_head_and_save(target, target_dir, head_dir, plain_train=plain_train, plain_valid=plain_valid,
                             chat_tokens=chat_tokens, rng=np.random.default_rng(seed + 2), head_steps=head_steps,
                             head_lr=head_lr)
    return {"checked": checked, "acted": acted, "steps": step, "seconds": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.demo.act", description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="the pair taught to end its turns: MODELS/target and MODELS/mtp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500, help="at most; it stops once the held-out turns come out right")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--head-steps", type=int, default=500)
    parser.add_argument("--head-lr", type=float, default=3e-4)
    parser.add_argument("--inputs", type=Path, help="keep the inputs read (recordings, residuals) in this folder, "
                        "and read them from it when they are there: a second run trains at once")
    parser.add_argument("--always-act", action="store_true",
                        help="answer every agent request with the call (\"say hi\" too), then words after its result")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    try:
        teach(args.models, seed=args.seed, steps=args.steps, lr=args.lr, head_steps=args.head_steps, head_lr=args.head_lr,
              inputs=args.inputs, always_act=args.always_act)
    except UserError as e:
        return print_error(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
