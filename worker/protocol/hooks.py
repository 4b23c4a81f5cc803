"""The per-request view of the target's logits (`Sequence.hook`): masks before sampling, logprobs after.

Runs in the generation thread. `constrain` is called with a row's logits at every verified
position ([k+1, vocab]) and the row's own draft; `observe` with the raw logits of the tokens just
emitted. Logprobs are therefore the target's raw distribution (before temperature, top-p and any
grammar mask), at every emitted token, with or without speculation.

Speculation stays lossless under a grammar: position j is masked given the drafted prefix before
it; at the first drafted token the grammar rejects, that token is masked out at its own position,
the target's sample there differs from it, and the draft is cut exactly there. Positions past the
cut are never emitted, so they are left unmasked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

#: The most alternatives a client may ask for per token: OpenAI's own limit for chat.
MAX_TOP_LOGPROBS = 20


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # best first


class Constraint:
    """An llguidance matcher that starts where the reasoning ends (at `think_end_id`, when the prompt opened a think block).

    While the reasoning lasts, `end_ids` (the tokens that end the turn) are masked out: the forced
    structure has not had its turn yet, so the reasoning ends with `think_end_id`, never with the turn.
    """

    def __init__(self, matcher, vocab_size: int, think_end_id: int | None = None, reasoning: bool = False,
                 end_ids: tuple[int, ...] = ()):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.think_end_id = think_end_id
        self.reasoning = reasoning and think_end_id is not None
        self.end_ids = tuple(i for i in end_ids if 0 <= i < vocab_size and i != think_end_id)
        # The mask every reasoning position gets (None: nothing to mask), built once per request.
        self._reasoning_mask: np.ndarray | None = None
        if self.end_ids:
            self._reasoning_mask = np.ones(vocab_size, dtype=bool)
            self._reasoning_mask[list(self.end_ids)] = False
        self.masked_positions = 0  # how many positions were masked, for tests and the bench

    def _allowed(self) -> np.ndarray:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)

    def mask(self, logits: mx.array, drafted: list[int]) -> mx.array:
        rows = logits.shape[0]
        masks: list[np.ndarray | None] = []
        consumed, reasoning = 0, self.reasoning
        for j in range(min(len(drafted) + 1, rows)):
            allowed = self._reasoning_mask if reasoning else self._allowed()
            masks.append(allowed)
            if j == len(drafted):
                break
            tok = drafted[j]
            if reasoning:
                if tok in self.end_ids:
                    break  # the draft is cut here, as at a token the grammar rejects
                reasoning = tok != self.think_end_id
                continue
            if not (0 <= tok < len(allowed) and allowed[tok]):
                break  # the draft is cut here: its later positions are never emitted
            if not self.matcher.consume_token(tok):
                break
            consumed += 1
        if consumed:
            self.matcher.rollback(consumed)
        if all(m is None for m in masks):
            return logits
        self.masked_positions += sum(m is not None for m in masks)
        full = np.ones((rows, logits.shape[1]), dtype=bool)
        for j, m in enumerate(masks):
            if m is not None:
                full[j, : len(m)] = m
                full[j, len(m):] = False
        return mx.where(mx.array(full), logits, mx.array(-float("inf"), dtype=logits.dtype))

    def advance(self, tokens: list[int]) -> None:
        for tok in tokens:
            if self.reasoning:
                self.reasoning = tok != self.think_end_id
                continue
            self.matcher.consume_token(tok)


class ThinkBudget:
    """A reasoning budget: once `budget` tokens of reasoning are written, only `think_end_id` may
    follow, so what comes after the reasoning (a forced call, a schema's JSON) always gets its turn.
    Masks each verified position given the drafted prefix before it, as `Constraint` does: at the
    first drafted token past the budget that is not the end marker, the draft is cut."""

    def __init__(self, think_end_id: int, budget: int):
        self.think_end_id = think_end_id
        self.budget = budget
        self.used = 0  # reasoning tokens written so far
        self.reasoning = True

    def _closing(self, used: int, reasoning: bool) -> bool:
        return reasoning and used >= self.budget

    def mask(self, logits: mx.array, drafted: list[int]) -> mx.array:
        rows = logits.shape[0]
        forced: list[int] = []
        used, reasoning = self.used, self.reasoning
        for j in range(min(len(drafted) + 1, rows)):
            if self._closing(used, reasoning):
                forced.append(j)
            if j == len(drafted) or not reasoning:
                break
            tok = drafted[j]
            if forced and forced[-1] == j and tok != self.think_end_id:
                break  # the draft is cut here: its later positions are never emitted
            reasoning, used = tok != self.think_end_id, used + (tok != self.think_end_id)
        if not forced:
            return logits
        keep = np.ones((rows, logits.shape[1]), dtype=bool)
        for j in forced:
            keep[j] = False
            keep[j, self.think_end_id] = True
        return mx.where(mx.array(keep), logits, mx.array(-float("inf"), dtype=logits.dtype))

    def advance(self, tokens: list[int]) -> None:
        for tok in tokens:
            if not self.reasoning:
                return
            if tok == self.think_end_id:
                self.reasoning = False
            else:
                self.used += 1


class BanTokens:
    """A fixed mask: these ids are never sampled (`tool_choice: none` bans the tool-call opener)."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def mask(self, logits: mx.array, drafted: list[int]) -> mx.array:
        ban = np.zeros(logits.shape[1], dtype=bool)
        ban[self.ids] = True
        return mx.where(mx.array(ban)[None], mx.array(-float("inf"), dtype=logits.dtype), logits)

    def advance(self, tokens: list[int]) -> None:
        pass


@dataclass
class RowHook:
    top_logprobs: int | None = None  # None: no logprobs; 0: the chosen token's only
    constraint: Constraint | BanTokens | None = None
    budget: ThinkBudget | None = None  # applied before `constraint`: the reasoning ends first
    logprobs: list[TokenLogprob] = field(default_factory=list)
    _taken: int = 0

    def constrain(self, logits: mx.array, drafted: list[int]) -> mx.array:
        if self.budget is not None:
            logits = self.budget.mask(logits, drafted)
        return self.constraint.mask(logits, drafted) if self.constraint is not None else logits

    def observe(self, logits: mx.array, tokens: list[int]) -> None:
        if self.budget is not None:
            self.budget.advance(tokens)
        if self.constraint is not None:
            self.constraint.advance(tokens)
        if self.top_logprobs is None or not tokens:
            return
        logits = logits.astype(mx.float32)
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(lp, mx.array(tokens, dtype=mx.int32)[:, None], axis=-1)[:, 0]
        top = self.top_logprobs
        if top > 0:
            idx = mx.argpartition(-lp, kth=top - 1, axis=-1)[:, :top]
            vals = mx.take_along_axis(lp, idx, axis=-1)
            mx.eval(chosen, idx, vals)
            idx, vals = idx.tolist(), vals.tolist()
        chosen = chosen.tolist()
        for i, tok in enumerate(tokens):
            alts = sorted(zip(idx[i], vals[i]), key=lambda p: -p[1]) if top > 0 else []
            self.logprobs.append(TokenLogprob(tok, chosen[i], alts))

    def fork(self) -> "RowHook":
        """The same settings for another row of the same request (`n` > 1), in its starting state."""
        constraint = self.constraint
        if isinstance(constraint, Constraint):
            constraint = Constraint(constraint.matcher.deep_copy(), constraint.vocab_size, constraint.think_end_id,
                                    constraint.reasoning, constraint.end_ids)
        budget = ThinkBudget(self.budget.think_end_id, self.budget.budget) if self.budget is not None else None
        return RowHook(self.top_logprobs, constraint, budget)

    def take(self) -> list[TokenLogprob]:
        """Entries not handed out yet (called from the generation thread)."""
        out = self.logprobs[self._taken:]
        self._taken = len(self.logprobs)
        return out
