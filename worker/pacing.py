"""How much of a prompt a step prefills while other rows decode: a budget in time, from measured costs.

A step runs the decoding rows' draft-and-verify forward, then, when the budget allows, one chunk of
every prompt still going in (`mtpstack.worker.scheduler`). A decoding row waits for both, so the
chunk sets its time between tokens. A token budget (as vLLM's chunked prefill has) does not bound
that time here: a prompt token costs more the longer the context it attends to (a 512-token chunk
took ~3 s at 8k tokens on the widened demo target, so a neighbour's long prompt left a stream one
token every ~4 s).

So the prefill is paced in time, two ways. Its share: the prefill forwards owe the decoding rows
their time (`debt`): a chunk's seconds are added, and every decode step pays back
`(1 - DECODE_SHARE) / DECODE_SHARE` of its own; a chunk runs only once the debt is paid, so over a
prompt the decoding rows keep `DECODE_SHARE` of the time, and of their rate. Its chunk: the most
prompt tokens whose forward, after a decode step, keeps the gap between a row's tokens within
`MAX_GAP` (or `GAP_STEPS` decode steps, where a step alone is that slow): a small chunk pays a
forward's fixed cost for few tokens, so the prompt goes in fastest in the largest chunk the gap
allows, every few steps, rather than a sliver every step. `Pacer` keeps running estimates of the
decoding rows' step and of a prompt token's seconds in recent prefill forwards (at the context
those rows are at now, so it follows their growth); with `t(n) = a + b n` for a forward of n
tokens, sizing the next chunk from the last one's `t / n` converges on the n whose forward fills
the gap, from below. While nothing decodes a prompt runs whole chunks (`PREFILL_CHUNK`), its
fastest pace.

It also keeps what `/metrics` shows of the last minute: prompt tokens per second of prefill, and
the longest gap between two steps that gave a decoding row tokens.
"""

from __future__ import annotations

import collections
import time

#: The share of a step's time the decoding rows keep while prompts prefill beside them.
DECODE_SHARE = 0.5
#: The longest a decoding row should wait between tokens for a neighbour's prompt (seconds), aimed
#: below issue 47's bound (0.5 s) so an estimate's error stays within it.
MAX_GAP = 0.4
#: ... or this many of its own decode steps, where a decode step alone is that slow.
GAP_STEPS = 4
#: The fewest prompt tokens a prefilling row gets per step, however slow a token is.
MIN_PREFILL_SHARE = 16
#: Weight of the newest measurement in the running estimates.
SMOOTHING = 0.5
#: The window of the figures `/metrics` shows (seconds).
WINDOW = 60.0


class Pacer:
    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.decode_seconds: float | None = None  # the decoding rows' step, running estimate
        self.token_seconds: float | None = None  # a prompt token in a prefill forward, running estimate
        self._prefills: collections.deque = collections.deque()  # (when, tokens, seconds)
        self._gaps: collections.deque = collections.deque()  # (when, gap seconds)
        self._last_tokens: float | None = None  # when a step last gave decoding rows tokens
        #: Prefill seconds the decoding rows have not yet been paid back (`DECODE_SHARE`).
        self.debt = 0.0

    @staticmethod
    def _blend(old: float | None, new: float) -> float:
        return new if old is None else SMOOTHING * new + (1 - SMOOTHING) * old

    def decoded(self, seconds: float) -> None:
        self.decode_seconds = self._blend(self.decode_seconds, seconds)
        self.debt = max(0.0, self.debt - seconds * (1 - DECODE_SHARE) / DECODE_SHARE)

    def prefilled(self, tokens: int, seconds: float, beside: bool = True) -> None:
        """A prefill forward of `tokens` took `seconds`; `beside`: rows were decoding (it is owed to them)."""
        if tokens <= 0:
            return
        if beside:
            self.debt += seconds
        self.token_seconds = self._blend(self.token_seconds, seconds / tokens)
        now = self.clock()
        self._prefills.append((now, tokens, seconds))
        self._trim(now)

    def step_ended(self, decoding: bool) -> None:
        """After a step: whether rows decoded in it (the gap since the last such step is recorded)."""
        now = self.clock()
        if not decoding:
            self._last_tokens = None  # nothing waits: the next row's first gap starts at its first step
            self.debt = 0.0  # and nothing is owed to rows that are gone
            return
        if self._last_tokens is not None:
            self._gaps.append((now, now - self._last_tokens))
        self._last_tokens = now
        self._trim(now)

    def gap(self) -> float:
        """The longest a decoding row should wait between tokens: `MAX_GAP`, or `GAP_STEPS` of its steps."""
        return max(MAX_GAP, GAP_STEPS * (self.decode_seconds or 0.0))

    def budget_tokens(self) -> int:
        """Prompt tokens this step may prefill in all while rows decode: 0 while the prefill owes the
        decoding rows their share, else what fits the gap after a decode step (`MIN_PREFILL_SHARE`
        before a measurement: the first chunk is small and sizes the next)."""
        if self.decode_seconds is None or self.token_seconds is None:
            return MIN_PREFILL_SHARE
        if self.debt > 0:
            return 0
        return max(1, int((self.gap() - self.decode_seconds) / self.token_seconds))

    def share(self, prefilling: int, chunk: int, tokens: int | None = None) -> int:
        """Prompt tokens each of `prefilling` rows runs this step while rows decode (at most `chunk`; 0: none
        this step), of `tokens` in all (default: `budget_tokens()`; a distributed worker's rank 0 decides
        it for every rank)."""
        tokens = self.budget_tokens() if tokens is None else tokens
        if tokens <= 0:
            return 0
        return max(MIN_PREFILL_SHARE, min(chunk, tokens // max(prefilling, 1)))

    def _trim(self, now: float) -> None:
        for q in (self._prefills, self._gaps):
            while q and now - q[0][0] > WINDOW:
                q.popleft()

    def prefill_rate(self) -> float:
        """Prompt tokens per second of prefill forwards over the last minute (0 when none ran)."""
        self._trim(self.clock())
        seconds = sum(s for _, _, s in self._prefills)
        return sum(n for _, n, _ in self._prefills) / seconds if seconds > 0 else 0.0

    def longest_gap(self) -> float:
        """The longest wait between two steps that gave decoding rows tokens, over the last minute."""
        self._trim(self.clock())
        return max((g for _, g in self._gaps), default=0.0)
