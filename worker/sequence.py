"""One request's decoding state: its prompt's prefill progress, its sampling, and its output.

A `Sequence` is a row of the scheduler's prefill batch while its prompt goes in (a chunk a
step, `mtpstack.worker.batch.PrefillBatch`), then a row of the decoding batch
(`mtpstack.worker.batch.Batch`). The batches hold the caches and run the forwards; they move
a sequence along through its methods: how far its prompt is in (`next_chunk`,
`advance_prefill`, `resume`), where the prefix cache snapshots it (`snapshot_due`), a token
drawn from the target's distribution (`sample`), and the tokens a step chose (`emit`: cut at
EOS, a stop string or `max_tokens`). Between any two steps it can be dropped without
affecting any other sequence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p

#: The most prompt tokens a row prefills in one step, and the prefix cache's snapshot
#: interval: a chunk never crosses a multiple of it, so every prompt is snapshotted at
#: the same absolute positions and two prompts that share 1,100 tokens share two snapshots.
PREFILL_CHUNK = 512


def greedy_tokens(logits: mx.array) -> mx.array:
    """The target's greedy choice at every position of `logits` ([..., vocab]): its argmax."""
    return mx.argmax(logits, axis=-1).astype(mx.uint32)


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    depth: int = 0  # already capped at the worker's depth; with `auto`, the most a step may draft
    auto: bool = False  # the step's depth is chosen by the worker's policy (`mtpstack.worker.depth_policy`)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class StepResult:
    """What one step of one sequence did."""

    drafted: int = 0  # tokens the drafter proposed
    accepted: int = 0  # of those, how many the target confirmed
    tokens: int = 0  # tokens added to the output (after EOS/stop/max_tokens cuts)
    prefill: int = 0  # prompt tokens processed


class Sequence:
    """One request's decoding state.

    While its prompt is prefilled (a chunk per step) the sequence is a row of the
    prefill batch; once the prompt is in and its first token sampled, it joins the
    decoding batch as a row and its caches live there.
    """

    def __init__(self, engine, prompt: list[int], params: SamplingParams):
        if not prompt:
            raise ValueError("empty prompt")
        self.engine = engine  # `mtpstack.worker.loading.Engine`: its tokenizer and drafter
        self.prompt = list(prompt)
        self.params = params
        self.use_drafter = engine.drafter is not None and params.depth > 0
        self._prefilled = 0  # prompt tokens in the caches
        self.carry = None  # the target's final hidden state at the last prefilled position [1, 1, H]
        #: Positions besides the multiples of PREFILL_CHUNK where the prefix cache snapshots the
        #: prompt (the chat template's message boundaries); one token before its end always is one.
        self.snapshot_at: set[int] = set()
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache
        self.prefilling = False  # a row of the scheduler's prefill batch
        self.y: int | None = None  # the last emitted token, the target's next input
        self.draft = None  # the drafter's own state for this row (`mtpstack.worker.drafting`); opaque here
        self.acceptance = None  # its live acceptance per draft position, once it drafted (`depth_policy.Acceptance`)
        self.in_batch = False
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0
        self.finish_reason: str | None = None
        self.drafted = 0
        self.accepted = 0
        self._detok = engine.tokenizer.detokenizer
        self.cancelled = False  # set from another thread; honoured before the next step
        self.handle = None  # the server's per-request bridge
        # Optional per-request view of the target's logits (mtpstack.worker.protocol.hooks): `constrain(logits,
        # drafted)` returns the [n, vocab] logits to sample from (a grammar mask), `observe(logits,
        # tokens)` sees the raw logits of the tokens just emitted (logprobs, the grammar's advance).
        self.hook = None
        self._stop_scan = 0
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        # The key is made on first use, in the generation thread: only that thread touches mlx.
        self._seed = params.seed if params.seed is not None else random.getrandbits(63)
        self._key = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def decoding(self) -> bool:
        """True once the prompt is in and the sequence is a row of the batch."""
        return self.in_batch and not self.finished

    # -- the prompt's prefill ------------------------------------------------------------

    @property
    def prefilled(self) -> int:
        """Prompt tokens in the caches."""
        return self._prefilled

    def resume(self, length: int, carry) -> None:
        """Start the prefill `length` tokens in, from a prefix-cache hit whose last hidden state is `carry`."""
        self._prefilled = self.cached_tokens = length
        self.carry = carry

    def next_chunk(self, share: int, snapshots: bool = False) -> list[int]:
        """The prompt tokens this row prefills next: at most `share`, never past a multiple of
        PREFILL_CHUNK nor (`snapshots`: a prefix cache takes them) past another snapshot point."""
        start = self._prefilled
        end = min(len(self.prompt), start + share, (start // PREFILL_CHUNK + 1) * PREFILL_CHUNK)
        for point in self._points() if snapshots else ():
            if start < point < end:
                end = point
        return self.prompt[start:end]

    def completes_prompt(self, n: int) -> bool:
        """Whether `n` more prompt tokens bring the whole prompt in."""
        return self._prefilled + n >= len(self.prompt)

    def advance_prefill(self, n: int) -> None:
        """`n` more prompt tokens are in the caches."""
        self._prefilled += n

    def _points(self) -> set[int]:
        """Where the prompt is snapshotted besides the multiples of PREFILL_CHUNK: the hints, and one
        token before its end. Not at the end itself: a tokenizer may merge the prompt's last token
        (`assistant\n`) with the answer's first (`\n\n`) when the answer comes back in the next
        turn's history, which then shares all but the last token; resuming one token earlier costs
        a one-token prefill on an exact repeat."""
        return self.snapshot_at | ({len(self.prompt) - 1} if len(self.prompt) > 1 else set())

    def snapshot_points(self, after: int, upto: int) -> list[int]:
        """The positions in (after, upto] where this prompt is snapshotted, in order."""
        chunks = range((after // PREFILL_CHUNK + 1) * PREFILL_CHUNK, upto + 1, PREFILL_CHUNK)
        return sorted({*chunks, *(p for p in self._points() if after < p <= upto)})

    def snapshot_due(self, since: int) -> bool:
        """Whether the prompt is in up to a snapshot point past `since` (where the last snapshot ended)."""
        pos = self._prefilled
        return pos > since and (pos % PREFILL_CHUNK == 0 or pos in self._points())

    # -- decoding -------------------------------------------------------------------------

    def plan(self, depth: int | None = None) -> int:
        """How many tokens this row drafts next step: never more than could be emitted (k + 1 <= left).
        `depth`: the step's depth the policy chose, which a row of `auto` depth drafts up to its own cap."""
        if not self.use_drafter:
            return 0
        cap = self.params.depth if depth is None or not self.params.auto else min(depth, self.params.depth)
        return max(0, min(cap, self.params.max_tokens - len(self.tokens) - 1))

    @property
    def adaptive(self) -> bool:
        """Whether the worker's policy picks this row's depth step by step (`auto`)."""
        return self.use_drafter and self.params.auto

    @property
    def greedy(self) -> bool:
        """Whether this sequence samples the target's argmax (temperature 0)."""
        return self.params.temperature <= 0

    def sample(self, logits: mx.array) -> mx.array:
        """One token per row of `logits` ([n, vocab]) from the target's distribution."""
        p = self.params
        if self.greedy:
            return greedy_tokens(logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < p.top_p < 1:
            logprobs = apply_top_p(logprobs, p.top_p)
        if self._key is None:
            self._key = mx.random.key(self._seed)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / p.temperature), key=sub).astype(mx.uint32)

    # -- output ------------------------------------------------------------------------

    def emit(self, tokens: list[int], logits: mx.array) -> int:
        """The tokens a step chose (the last is the target's next input), `logits` their rows: the
        output takes them up to EOS, a stop string or `max_tokens`, and the hook sees what it took.
        Returns how many it took."""
        self.y = tokens[-1]
        count = self._append(tokens)
        if self.hook is not None:
            self.hook.observe(logits[:count], tokens[:count])
        return count

    def _append(self, tokens: list[int]) -> int:
        count = 0
        for tok in tokens:
            if tok in self.engine.eos_token_ids and not self.params.ignore_eos:
                self._finish("stop")
                break
            self.tokens.append(tok)
            count += 1
            self._detok.add_token(tok)
            self.text += self._detok.last_segment
            if self._check_stop():
                break
            if len(self.tokens) >= self.params.max_tokens:
                self._finish("length")
                break
        return count

    def _check_stop(self) -> bool:
        if not self.params.stop:
            return False
        start = max(0, self._stop_scan - self._hold)
        hits = [i for i in (self.text.find(s, start) for s in self.params.stop) if i >= 0]
        self._stop_scan = len(self.text)
        if hits:
            self.text = self.text[: min(hits)]
            self.finish_reason = "stop"
            return True
        return False

    def _finish(self, reason: str) -> None:
        self._detok.finalize()
        self.text += self._detok.last_segment
        if not self._check_stop():
            self.finish_reason = reason

    def cancel(self) -> None:
        if not self.finished:
            self.finish_reason = "cancelled"

    def take_text(self) -> str:
        """Text not handed out yet; while running, a possible stop-string prefix is held back."""
        end = len(self.text) if self.finished else max(self.sent, len(self.text) - self._hold)
        out = self.text[self.sent : end]
        self.sent = end
        return out
