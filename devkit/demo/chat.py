"""Teach the extended demo pair to end its turns (and, with `--agents`, to call a tool when an agent asks
it to act): a fine-tune on chat-shaped text (and Claude Code's and Codex CLI's own requests), then the
head again.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m devkit.demo.chat --models worker/demo/models [--agents]

Trained on documents alone, the demo continues whatever it is given until `max_tokens`: it never
writes `<|im_end|>`, so every answer is cut, and an agent that checks (Codex: "Incomplete response
... max_output_tokens") gives up; and it never calls a tool, so an agent asked to act does nothing.
This step (after `devkit.demo.extend`; not part of `devkit.demo.train`) fine-tunes the target, in
place, on three streams taken in a fixed order (STREAM_PATTERN; with `--agents` a fourth,
AGENT_STREAM_PATTERN):

- the training documents as before (so its code and prose, and the head's acceptance, stay);
- conversations cut from the same documents, rendered by the worker's own template code in the
  family's format: an optional system message, one to three user turns of document lines, each
  answered by repeating the turn's first line (at most ANSWER_CHARS), then `<|im_end|>`. An echo:
  copying is the one behaviour a model this small learns reliably enough to end every turn (see
  `conversations`). One answer in five opens with a short reasoning block (the template's
  thinking switch on), so with thinking on the block is closed too. The `<|im_end|>` labels weigh
  more than the rest (END_WEIGHT, PROMPT_WEIGHT);
- the ends of conversations whose system message is most of a LONG_WINDOW-token window, so a turn
  still ends after an agent's thousands of tokens of instructions;
- with `--agents`, agent turns (`AgentTurns`): Claude Code's and Codex CLI's real requests, recorded from the
  clients when the run starts (`devkit.demo.agent_turns`: their system prompts, their tools'
  schemas, their context turns), with the user's request replaced: a request to act on files or
  run a command is answered with one call of the client's shell tool in the template's own
  `<tool_call>` format, and the request after the command's real output (in the client's own
  result shape) with its first line; a request that needs no tool with an echo. These prompts are
  16k-23k tokens: they are learned in parts (`devkit.demo.long_turns`), the gated-delta layers
  in chunks (`devkit.demo.fast_delta`).

The fine-tune stops as soon as its check passes (looked at every CHECK_EVERY steps, `passes_all`):
greedy answers to short chats, thinking off and on, each end with `<|im_end|>` within
`--check-tokens` and without writing another turn's header (`passes`; the answers to an agent-sized
prompt, prose instructions as long as Codex CLI's, are logged beside them but not required), and,
with `--agents`, each client's check recording (a folder like the live tests') gets what `acts_as_agent` expects:
"list the files" one call of its shell tool running `ls`, then after its output words that end,
"say hi" words that end. Passing the check is necessary, not sufficient: the live tests
(tests/e2e/test_codex_live.py, test_claude_live.py) run the clients themselves. Then the head
(warm-started from its current weights; it borrows the target's embeddings and LM head, so it must
follow them) is trained on documents and conversations against the fine-tuned target's own
next-token distribution (`head_distill_losses`: acceptance is agreement with the target, and the
fine-tune changed the target's text; against the documents' tokens the head drafted it worse than
before). Both are written only then, each checked to load back to exactly what was trained.
Afterwards measure acceptance (`python -m devkit.demo.acceptance`): it must stay at least the
figure in docs/demo-models.md.

With `--agents` the run records the clients (Claude Code and Codex CLI, as `scripts/test` installs
them; their binaries as the live tests find them, `agent_turns.client_binary`), so it needs both.
The shipped pair has not been through it yet (docs/demo-models.md, "Calling tools": what it costs on
2 shared cores). A run that stops keeps the target's weights (MODELS/CHECKPOINT) and, with
`--agents`, its recordings (MODELS/RECORDINGS): `--resume` goes on with the same requests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from devkit.demo import agent_turns, corpus, long_turns
from devkit.demo.fast_delta import chunked_gated_delta_layers
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
#: With `--agents`, agent turns (3) too: half the steps, the new behaviour, alternating Claude Code and Codex.
AGENT_STREAM_PATTERN = (0, 3, 1, 3, 2, 3)
#: Recordings of each client the fine-tune learns from (each in its own folder and home); one more
#: of each, in a folder like the live tests' (CHECK_FILES), is the check's.
AGENT_RECORDINGS = 2
CHECK_FILES = {"notes.txt": "hello\n"}
#: Where a run that has not finished keeps its recordings, for `--resume` (the same requests again).
RECORDINGS = ".agent-recordings.json"
#: Label weight of an agent answer's first token: whether it calls a tool or talks is decided there.
DECISION_WEIGHT = 4.0
#: Agent episodes in one step's loss (`--agent-episodes`), the clients alternating. Four did not stop
#: the collapse onto one answer that one showed (docs/demo-models.md, "Calling tools").
AGENT_EPISODES = 1
#: Agent steps between refreshes of the recordings' contexts (the system part's state and the
#: constant part after the request, computed at the weights of the moment: about a minute each).
REFRESH_EVERY = 40
#: Tokens an agent check's answer may take: a call of the shell tool takes about 30.
AGENT_CHECK_TOKENS = 96
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


# -- agent turns: Claude Code's and Codex CLI's own requests (`devkit.demo.agent_turns`) -----------


def document_lines(seed: int) -> list[str]:
    """Lines of code and prose the scratch folders' files are made of."""
    texts = corpus.sample(corpus.code_texts(), 200_000) + corpus.sample(corpus.prose_texts(), 200_000)
    return [line for t in texts for line in _lines(t)]


def record_clients(scratch: Path, seed: int, count: int = AGENT_RECORDINGS) -> dict[str, list[agent_turns.Recording]]:
    """`count` recordings of each client to learn from, then the check's (CHECK_FILES)."""
    rng = np.random.default_rng(seed + 5)
    lines = document_lines(seed)
    out = {}
    for client in agent_turns.CLIENTS:
        t0 = time.monotonic()
        out[client] = [agent_turns.record(client, scratch, f"{client}-{i}", lines, rng) for i in range(count)]
        check = agent_turns.record(client, scratch, f"{client}-check", [], rng, files=CHECK_FILES)
        out[client].append(check)
        log(f"agent turns: recorded {client} {count + 1} times ({time.monotonic() - t0:.0f}s)")
    return out


def save_recordings(path: Path, recordings: dict[str, list[agent_turns.Recording]]) -> None:
    from dataclasses import asdict

    staged = path.with_name(path.name + ".partial")
    staged.write_text(json.dumps({c: [asdict(r) for r in rs] for c, rs in recordings.items()}))
    staged.replace(path)


def load_recordings(path: Path) -> dict[str, list[agent_turns.Recording]]:
    return {c: [agent_turns.Recording(**r) for r in rs] for c, rs in json.loads(path.read_text()).items()}


def agent_weights(turn: agent_turns.Turn, n_prompt: int) -> list[float]:
    """Label weights of a turn's tokens after its prompt's shared part: PROMPT_WEIGHT in the prompt,
    DECISION_WEIGHT on the answer's first token (a call or words), 1 in the answer, END_WEIGHT on its
    `<|im_end|>`."""
    body = [DECISION_WEIGHT] + [1.0] * (len(turn.answer) - 2) if len(turn.answer) > 1 else []
    return [PROMPT_WEIGHT] * n_prompt + body + [END_WEIGHT]


class AgentTurns:
    """Endless steps of `episodes` agent episodes each, made ready for `long_turns.loss`: Claude Code
    and Codex in turn, a recording at random, a request at random (`agent_turns.sample_request`) on
    a new scratch folder whose real command output is the tool's result. The recordings' contexts
    are computed at the weights of the moment every REFRESH_EVERY steps."""

    def __init__(self, model, tokenizer, recordings, scratch: Path, seed: int, episodes: int = AGENT_EPISODES):
        self.model, self.tokenizer, self.recordings, self.scratch = model, tokenizer, recordings, scratch
        self.episodes = episodes
        self.rng = np.random.default_rng(seed + 6)
        self.lines = document_lines(seed)
        self.contexts: dict = {}
        self.count = 0

    def _folder(self, rng) -> tuple[Path, list[str]]:
        folder = self.scratch / "episode"
        shutil.rmtree(folder, ignore_errors=True)
        return folder, agent_turns.make_folder(folder, rng, self.lines)

    def refresh(self) -> None:
        t0 = time.monotonic()
        for client, recordings in self.recordings.items():
            for i, rec in enumerate(recordings[:AGENT_RECORDINGS]):
                folder, _ = self._folder(np.random.default_rng(i))
                own = agent_turns.episode(self.tokenizer, rec, i, rec.request, "ls", folder)
                self.contexts[client, i] = long_turns.context(self.model, own.shared[: own.system], own)
        log(f"agent turns: contexts computed at the current weights ({time.monotonic() - t0:.0f}s)")

    def __iter__(self):
        return self

    def __next__(self) -> tuple[long_turns.Prepared, ...]:
        if self.count % REFRESH_EVERY == 0:
            self.refresh()
        self.count += 1
        clients = list(self.recordings)
        return tuple(self._one(clients[k % len(clients)]) for k in range(self.episodes))

    def _one(self, client: str) -> long_turns.Prepared:
        i = int(self.rng.integers(AGENT_RECORDINGS))
        folder, files = self._folder(self.rng)
        request, command = agent_turns.sample_request(self.rng, files)
        ep = agent_turns.episode(self.tokenizer, self.recordings[client][i], i, request, command, folder)
        return long_turns.prepare(self.model, ep, self.contexts[client, i], agent_weights)


def acts_as_agent(model, tokenizer, recordings, scratch: Path, *, max_tokens: int = AGENT_CHECK_TOKENS,
                  requests: dict[str, list[tuple[str, str | None]]] | None = None) -> list[tuple[str, str, bool]]:
    """(what was asked, the greedy answer, as expected) for each client's check recording: each of
    `agent_turns.CHECK_REQUESTS`, the first turn, then, for a request to act, the turn after the
    command's real output (in a folder holding CHECK_FILES, as the live tests' does). As expected: a
    request to act gets exactly one call of the client's shell tool with that command, and ends; any
    other turn gets words and ends, without a call or another turn's header."""
    from mtpstack.worker.protocol import messages, responses
    from mtpstack.worker.protocol.output import Markers, OutputSplitter

    folder = scratch / "check"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, text in CHECK_FILES.items():
        (folder / name).write_text(text)
    stop = set(tokenizer.eos_token_ids)
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    results = []
    for client, recs in recordings.items():
        rec = recs[-1]
        tools = (messages if client == "claude" else responses).to_chat(rec.first).get("tools")
        tool, param = agent_turns.SHELL_TOOL[client]
        system = None
        for request, command in (requests or agent_turns.CHECK_REQUESTS)[client]:
            ep = agent_turns.episode(tokenizer, rec, -1, request, command, folder)
            if system is None:
                system = long_turns.prefill(model, ep.shared[: ep.system])
            for n, turn in enumerate(ep.turns):
                out = long_turns.greedy(model, system, turn.prompt[ep.system :], max_tokens=max_tokens, stop=stop)
                splitter = OutputSplitter(Markers.of(tokenizer), False, tools, True)
                text = tokenizer.decode(out)
                pieces = splitter.feed(text) + splitter.finish()
                ended = bool(out) and out[-1] in stop and im_start not in out
                calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in splitter.calls]
                if turn.call:
                    ok = ended and calls == [(tool, {param: command})]
                else:
                    ok = ended and not calls and any(p.kind == "content" and p.text.strip() for p in pieces)
                results.append((f"{client}: {request!r}" + (" after its result" if n else ""), text, ok))
    return results


def teach(models: Path, *, seed: int = 0, target_steps: int = 800, head_steps: int = 500, lr: float = 4e-4,
          head_lr: float = 3e-4, check_tokens: int = 96, resume: bool = False, agents: bool = False,
          check_every: int = CHECK_EVERY, agent_episodes: int = AGENT_EPISODES) -> dict:
    """Fine-tune MODELS/target until it ends its turns and acts as the agents ask, then its head; both
    written in place at the end. `resume`: start from the weights a stopped run left in
    MODELS/CHECKPOINT (and the step it reached), with the recordings it left in MODELS/RECORDINGS."""
    with chunked_gated_delta_layers(), tempfile.TemporaryDirectory(prefix="mtpstack-agent-turns-") as scratch:
        return _teach(Path(models), Path(scratch), seed=seed, target_steps=target_steps, head_steps=head_steps, lr=lr,
                      head_lr=head_lr, check_tokens=check_tokens, resume=resume, agents=agents, check_every=check_every,
                      agent_episodes=agent_episodes)


def passes_all(checked: list[tuple[str, bool]], acted: list[tuple[str, str, bool]] | None) -> bool:
    """The whole check: the short chats end (`passes`) and, when the agents were checked (`acted` not
    None), every agent turn is as expected (`acts_as_agent`)."""
    return passes(checked) and (acted is None or (bool(acted) and all(ok for _, _, ok in acted)))


def _teach(models: Path, scratch: Path, *, seed: int, target_steps: int, head_steps: int, lr: float, head_lr: float,
           check_tokens: int, resume: bool, agents: bool, check_every: int = CHECK_EVERY,
           agent_episodes: int = AGENT_EPISODES) -> dict:
    import mlx_lm

    target_dir, head_dir = models / "target", models / "mtp"
    target, tokenizer = mlx_lm.load(str(target_dir))
    if "</think>" not in tokenizer.vocab:
        raise ChatError(f"`{target_dir}` is not in the family's chat format yet",
                        "run `python -m devkit.demo.extend --models MODELS` first")
    t0 = time.monotonic()
    checkpoint, recorded = models / CHECKPOINT, models / RECORDINGS
    if resume and not checkpoint.is_file():
        raise ChatError(f"nothing to resume: `{checkpoint}` does not exist", "run without `--resume`")
    recordings = None
    if agents:
        recordings = load_recordings(recorded) if resume and recorded.is_file() else record_clients(scratch, seed)

    def check() -> tuple[list, list | None]:
        return (ends_its_turns(target, tokenizer, max_tokens=check_tokens),
                acts_as_agent(target, tokenizer, recordings, scratch) if agents else None)

    if not resume:
        checked, acted = check()
        if passes_all(checked, acted):
            log(f"`{target_dir}` ends its turns{' and acts as the agents ask' if agents else ''} already: "
                "left as it is")
            return {"checked": checked, "acted": acted, "target_steps": 0, "seconds": time.monotonic() - t0}
        _report(checked, acted)
    if agents:
        save_recordings(recorded, recordings)
    plain_train, plain_valid = split_docs(token_stream(), np.random.default_rng(seed))
    chat_train, chat_valid = chat_stream(tokenizer, seed)
    long_train = long_conversations(tokenizer, seed)
    log(f"target: ends {ending_accuracy(target, chat_valid):.0%} of held-out answers where they end, before")
    log(f"data: {len(plain_train):,} document and {len(chat_train[0]):,} conversation tokens "
        f"({time.monotonic() - t0:.0f}s)")

    batch = 8
    rng = np.random.default_rng(seed + 2)
    first, steps, checked, acted = 1, 0, [], None
    if resume:
        first = _restore(target, checkpoint) + 1
        log(f"target: resumed from `{checkpoint}` at step {first}")
        checked, acted = check()
        _report(checked, acted)
        if passes_all(checked, acted):  # a run stopped after its checkpoint passed
            steps = first - 1
            log(f"target: the checkpoint passes the check: no more steps ({steps} in all)")
    if not steps:
        streams = [windows(plain_train, rng, SEQ_LEN + 1, batch),
                   windows(chat_train[0], rng, CHAT_WINDOW + 1, batch, chat_train[1]),
                   long_windows(long_train, rng, LONG_BATCH)]
        if agents:
            streams.append(AgentTurns(target, tokenizer, recordings, scratch, seed, agent_episodes))
        steps, checked, acted = _fine_tune(target, pattern(streams, AGENT_STREAM_PATTERN if agents else STREAM_PATTERN),
                                           check, max_steps=target_steps, lr=lr, first=first, checkpoint=checkpoint,
                                           check_every=check_every)
    if not passes_all(checked, acted):
        missed = [asked for asked, _, ok in acted or [] if not ok]
        agent = "" if acted is None else (f", and {len(missed)} of {len(acted)} agent turns were not as expected "
                                          f"({', '.join(missed) or 'none'})")
        raise ChatError(f"{sum(not e for _, e in checked[:GATED])} of {GATED} short chats did not end within "
                        f"{check_tokens} tokens{agent} after {steps} steps",
                        f"train longer: `--resume --target-steps N` goes on from `{checkpoint}`")
    valid_plain = float(evaluate(lambda w: target_loss(target, w), plain_valid, SEQ_LEN + 1)[0])
    log(f"target: validation loss {valid_plain:.3f} on documents after {steps} steps; ends "
        f"{ending_accuracy(target, chat_valid):.0%} of held-out answers where they end")

    train_head_and_save(target, target_dir, head_dir, plain_train=plain_train, plain_valid=plain_valid,
                        chat_tokens=chat_train[0], rng=rng, head_steps=head_steps, head_lr=head_lr, batch=batch)
    checkpoint.unlink(missing_ok=True)
    recorded.unlink(missing_ok=True)
    return {"checked": checked, "acted": acted, "target_steps": steps, "seconds": time.monotonic() - t0}


def train_head_and_save(target, target_dir: Path, head_dir: Path, *, plain_train: np.ndarray, plain_valid: np.ndarray,
                        chat_tokens: np.ndarray, rng: np.random.Generator, head_steps: int, head_lr: float,
                        batch: int = 8) -> None:
    """Train the head again (warm start) against the fine-tuned target's own next-token distribution,
    then write both, each checked to load back to exactly what was trained."""
    from mlx_lm.utils import load_model

    from mtpstack.worker.mtp import load_head

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
        tokens_only(pattern([windows(plain_train, rng, width, batch), windows(chat_tokens, rng, width, batch)], (0, 1))),
        steps=head_steps, lr=head_lr, width=width)
    head.eval()
    log("head: validation loss %.3f / %.3f on documents at depth 1 / 2, after"
        % tuple(evaluate(lambda w: head_losses(head, target, w), plain_valid, SEQ_LEN + 3)))
    # Written only now that both are trained, and each checked to load back to exactly what was trained.
    _save_checked(target, target_dir, lambda d: load_model(d)[0], lambda m, ids: m(ids))
    _save_checked(head, head_dir, lambda d: load_head(d, target_dir).module,
                  lambda h, ids: h(target.language_model.model.embed_tokens(ids), _hidden(target, ids), [None]))


def _report(checked: list[tuple[str, bool]], acted: list[tuple[str, str, bool]] | None) -> None:
    agent = "" if acted is None else f", {sum(ok for _, _, ok in acted)} of {len(acted)} agent turns as expected"
    log(f"check: {sum(e for _, e in checked)} of {len(checked)} short chats end{agent}")
    for answer, ended in checked:
        log(f"  {'ends' if ended else 'CUT '} {answer[-70:]!r}")
    for asked, answer, ok in acted or []:
        log(f"  {'ok  ' if ok else 'MISS'} {asked}: {answer[-90:]!r}")


def is_agent(batch) -> bool:
    """Whether a step's batch is agent episodes (`AgentTurns`), not windows of tokens and weights."""
    return isinstance(batch, tuple) and bool(batch) and isinstance(batch[0], long_turns.Prepared)


def step_loss(model, batch) -> mx.array:
    """The loss of one step's batch: agent episodes' (`long_turns.loss`, their mean) or weighted windows'."""
    if is_agent(batch):
        return sum(long_turns.loss(model, b) for b in batch) / len(batch)
    return weighted_loss(model, batch)


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


def _fine_tune(target, data, check, *, max_steps: int, lr: float, first: int = 1, checkpoint: Path | None = None,
               check_every: int = CHECK_EVERY):
    """AdamW (short warm-up, then `lr`) on `target` from step `first` until `check()` passes
    (`passes_all`, looked at every `check_every` steps) or `max_steps`, its weights written to
    `checkpoint` at each failed check; returns (steps, the last check's two parts)."""
    warmup = 20
    optimizer = optim.AdamW(learning_rate=optim.join_schedules(
        [optim.linear_schedule(lr / 10, lr, warmup), lambda _: lr], [warmup]), weight_decay=0.01)
    loss_and_grad = nn.value_and_grad(target, step_loss)
    start, running, checked, acted = time.monotonic(), {}, [], []
    for i in range(first, max_steps + 1):
        batch = next(data)
        kind = "agent" if is_agent(batch) else "text"
        value, grads = loss_and_grad(target, batch)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(target, grads)
        mx.eval(target.parameters(), optimizer.state, value)
        running[kind] = value.item() if kind not in running else 0.9 * running[kind] + 0.1 * value.item()
        if i % 10 == 0:
            losses = ", ".join(f"{k} {v:.3f}" for k, v in sorted(running.items()))
            log(f"target step {i}/{max_steps} loss {losses} ({time.monotonic() - start:.0f}s)")
        if i % check_every == 0 or i == max_steps:
            target.eval()
            checked, acted = check()
            log(f"target step {i}:")
            _report(checked, acted)
            if passes_all(checked, acted):
                return i, checked, acted
            if checkpoint is not None:
                _checkpoint(target, checkpoint, i)
            target.train()
    return max_steps, checked, acted


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
    parser.add_argument("--check-every", type=int, default=CHECK_EVERY,
                        help="steps between checks (each check is minutes with --agents; the run stops at the first that passes)")
    parser.add_argument("--agent-episodes", type=int, default=AGENT_EPISODES,
                        help="agent episodes in one agent step's loss (with --agents)")
    parser.add_argument("--resume", action="store_true", help=f"go on from MODELS/{CHECKPOINT}, left by a run that stopped")
    parser.add_argument("--agents", action="store_true",
                        help="teach a tool round trip on Claude Code's and Codex CLI's recorded requests too (needs both)")
    args = parser.parse_args(argv)
    for flag in ("check_every", "agent_episodes"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    try:
        teach(args.models, seed=args.seed, target_steps=args.target_steps, head_steps=args.head_steps, lr=args.lr,
              head_lr=args.head_lr, check_tokens=args.check_tokens, resume=args.resume,
              agents=args.agents, check_every=args.check_every,
              agent_episodes=args.agent_episodes)
    except ChatError as e:
        return print_error(e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
