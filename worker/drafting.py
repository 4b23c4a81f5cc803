"""The two kinds of drafter, behind one batched interface.

- `HeadDrafter` (`mtp`): an MTP head. It drafts from the target's own final
  hidden state: the first proposal of a step comes from the previous step's
  accepted position (the "seed", computed when that step was accepted), each
  deeper one from the head's own output fed back with the token it just
  proposed. After verification, the head's entries for accepted drafts are
  kept, the rest rolled back, and the accepted tail is replayed with the
  target's verified hidden states (one head forward of one or two positions
  per row), which also yields the next seed. This is the cache discipline of
  the reference implementation (mlx-vlm's `qwen3_5_mtp` drafter), so the same
  head gives the same proposals here and there.
- `ModelDrafter` (`model`): a separate small language model with its own KV cache.

Both keep one resident batch cache (`mtpstack.worker.caches`) whose rows follow the
engine's decoding batch, and give the rows being prefilled caches of the same
kinds (`prefill_caches`, `prefill`: every prefilling row in one forward); a row
moves from those to the decoding batch when its prompt is in. Every
proposal is the drafter's argmax: the engine's acceptance rule (a draft stands
when it equals the target's own sample) keeps the target's distribution
whatever is proposed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import mlx.core as mx

from mtpstack.worker.caches import RaggedKVCache, batch_caches, commit, filter_rows, prepare_chunk
from mtpstack.worker.mtp.interface import MTPHead


class Drafter(Protocol):
    """What the batches (`mtpstack.worker.batch`) call on a drafter, `HeadDrafter` or `ModelDrafter`.

    A drafter keeps its per-row state in `seq.draft`, an object only it reads (a head's next first
    proposal and the state it came from; a draft model's tokens not yet fed to it): the engine's
    `Sequence` carries it and knows nothing of what is inside."""

    kind: str
    caches: list  # the decoding batch's, one row per decoding sequence

    def prefill_caches(self) -> list: ...
    def span(self, start: int, end: int) -> tuple[int, int]: ...
    def prefill(self, caches: list, rows: list, chunks: list[list[int]], hidden: mx.array | None,
                finals: dict[int, int], carries: list) -> None: ...
    def start(self, seq) -> None: ...
    def filter(self, rows: list[int]) -> None: ...
    def draft(self, rows: list, depth: int) -> mx.array: ...
    def accept(self, rows: list, depth: int, accepted: list[int], sampled: mx.array, drafts: mx.array, hidden: mx.array) -> None: ...
    def skip(self, rows: list, sampled: mx.array, hidden: mx.array) -> None: ...
    def arrays(self, rows: list) -> list: ...


@dataclass
class HeadRow:
    """An MTP head's state for one row: its next first proposal and the head output it came from."""

    token: mx.array  # [1] uint32
    hidden: mx.array  # [1, 1, H]
    #: Positions a step without drafting went past, (target hidden [1, 1, H], next token [1]): the head
    #: takes them in one forward before it drafts again (`HeadDrafter.skip`).
    behind: list = field(default_factory=list)


@dataclass
class ModelRow:
    """A draft model's state for one row: the tokens it has not consumed yet."""

    pending: list[int]


def _pick(x: mx.array, index: list[int]) -> mx.array:
    """Row r's position `index[r]` of x [rows, T, ...] -> [rows, 1, ...]."""
    at = mx.array(index, dtype=mx.int32).reshape((-1, 1) + (1,) * (x.ndim - 2))
    return mx.take_along_axis(x, at, axis=1)


#: The most positions a row's head state may trail its target before it catches up without drafting.
MAX_BEHIND = 64


class HeadDrafter:
    kind = "mtp"

    def __init__(self, head: MTPHead, target_parts):
        self.head = head
        # The target's embeddings and LM head, unless the head has its own (GLM's MTP layer does).
        self.embed = head.embed or target_parts.embed
        self.lm_head = head.logits or target_parts.lm_head
        self.caches = self.prefill_caches()

    def prefill_caches(self) -> list:
        return [RaggedKVCache() for _ in self.head.make_cache()]  # one per layer that keeps a cache

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The head's entries for prompt positions start..end-1: entry t pairs hidden t with token t+1."""
        return max(start - 1, 0), end - 1

    def _seed(self, out: mx.array) -> tuple[mx.array, mx.array]:
        """The next step's first proposal and the head state it came from, from head outputs [rows, 1, H]."""
        return mx.argmax(self.lm_head(out), axis=-1).astype(mx.uint32), out

    def prefill(self, caches, rows, chunks, hidden, finals, carries) -> None:
        """Head entries for each row's chunk, in one head forward over the rows (right-padded).

        A row's entry pairs the target's hidden state at a position with the next
        token: the hidden state carried from the row's previous chunk (None at the
        prompt's start) pairs with the chunk's first token, and so on; a row whose
        prompt ends here also pairs its last hidden state with its first
        generated token (`finals[r]`), which yields its first proposal (the seed).
        """
        tokens, states = [], []
        for r, (chunk, carry) in enumerate(zip(chunks, carries)):
            c = len(chunk)
            row_tokens = list(chunk) if carry is not None else list(chunk[1:])
            parts = ([carry] if carry is not None and c else []) + ([hidden[r : r + 1, : c - 1]] if c > 1 else [])
            if r in finals:
                row_tokens.append(finals[r])
                parts.append(hidden[r : r + 1, c - 1 : c] if c else carry)
            tokens.append(row_tokens)
            states.append(parts)
        lengths = [len(t) for t in tokens]
        width = max(lengths)
        if not width:
            return
        ref = next(p for parts in states for p in parts)  # some row has a position: width > 0
        padded = [mx.concatenate(parts + ([mx.zeros((1, width - n, ref.shape[2]), ref.dtype)] if n < width else []), axis=1)
                  for parts, n in zip(states, lengths)]
        ids = mx.array([t + [0] * (width - len(t)) for t in tokens], dtype=mx.uint32)
        out = self.head(self.embed(ids), mx.concatenate(padded), caches)
        commit(caches, lengths, width)
        for r in finals:
            rows[r].draft = HeadRow(*self._seed(_pick(out[r : r + 1], [lengths[r] - 1])))

    def start(self, seq) -> None:
        pass  # the seed was made by the last prefill chunk

    def filter(self, rows: list[int]) -> None:
        filter_rows(self.caches, rows)

    def skip(self, rows, sampled, hidden) -> None:
        """A step that drafted nothing (depth 0, `auto`): each row's new position waits for the head's next
        draft, so a stretch of plain decoding costs no head forward and leaves no gap in the head's cache."""
        for i, row in enumerate(rows):
            row.draft.behind.append((hidden[i : i + 1, :1], sampled[i : i + 1, :1]))
        if max(len(r.draft.behind) for r in rows) >= MAX_BEHIND:
            self._catch_up(rows)

    def _catch_up(self, rows) -> None:
        """The positions the head went past, every row's in one forward (right-padded); new seeds from each
        row's last."""
        lengths = [len(r.draft.behind) for r in rows]
        width = max(lengths)
        if not width:
            return
        ref = next(r.draft.behind[0][0] for r in rows if r.draft.behind)
        pad_state = mx.zeros((1, 1, ref.shape[2]), ref.dtype)
        pad_token = mx.zeros((1, 1), mx.uint32)
        states = mx.concatenate([mx.concatenate([h for h, _ in r.draft.behind] + [pad_state] * (width - n), axis=1)
                                 for r, n in zip(rows, lengths)])
        tokens = mx.concatenate([mx.concatenate([t.astype(mx.uint32) for _, t in r.draft.behind] + [pad_token] * (width - n), axis=1)
                                 for r, n in zip(rows, lengths)])
        out = self.head(self.embed(tokens), states, self.caches)
        commit(self.caches, lengths, width)
        for r, row in enumerate(rows):
            if lengths[r]:
                row.draft = HeadRow(*self._seed(_pick(out[r : r + 1], [lengths[r] - 1])))

    def draft(self, rows: list, depth: int) -> mx.array:
        if any(r.draft.behind for r in rows):
            self._catch_up(rows)
        token = mx.concatenate([r.draft.token.reshape(1, 1) for r in rows])
        state = mx.concatenate([r.draft.hidden for r in rows])
        proposals = [token]
        for _ in range(depth - 1):
            state = self.head(self.embed(token), state, self.caches)
            token = mx.argmax(self.lm_head(state), axis=-1).astype(mx.uint32)
            proposals.append(token)
        return mx.concatenate(proposals, axis=1)

    def accept(self, rows, depth, accepted, sampled, drafts, hidden) -> None:
        appended = depth - 1  # head entries this step's drafting added per row
        kept = [min(n, appended) for n in accepted]
        for cache in self.caches:
            cache.rollback([appended - k for k in kept])
        # Replay per row: drafts kept+1..n and the target's own token after them,
        # each paired with the target's verified hidden state one position earlier.
        lengths = [n - k + 1 for n, k in zip(accepted, kept)]
        width = max(lengths)
        positions = [[min(k + j, n) for j in range(width)] for n, k in zip(accepted, kept)]
        index = mx.array(positions, dtype=mx.int32)
        draft_at = mx.take_along_axis(drafts, mx.minimum(index, depth - 1), axis=1)
        row_tokens = mx.where(
            index < mx.array(accepted, dtype=mx.int32)[:, None],
            draft_at,
            mx.take_along_axis(sampled, index, axis=1),
        )
        states = mx.take_along_axis(hidden, index[..., None], axis=1)
        out = self.head(self.embed(row_tokens), states, self.caches)
        for cache in self.caches:
            cache.rollback([width - n for n in lengths])
        seeds, seed_states = self._seed(_pick(out, [n - 1 for n in lengths]))
        for i, row in enumerate(rows):
            row.draft = HeadRow(seeds[i : i + 1], seed_states[i : i + 1])

    def arrays(self, rows: list) -> list:
        return [a for r in rows if isinstance(r.draft, HeadRow) for a in (r.draft.token, r.draft.hidden)]


class ModelDrafter:
    kind = "model"

    def __init__(self, model, cache_kinds: list[str]):
        if any(kind != "kv" for kind in cache_kinds):
            raise ValueError("a separate draft model must keep plain KV caches (its rejected drafts are rolled back by length)")
        self.model = model
        self.kinds = cache_kinds
        self.caches = batch_caches(cache_kinds)

    def prefill_caches(self) -> list:
        return batch_caches(self.kinds, prefill=True)

    def span(self, start: int, end: int) -> tuple[int, int]:
        return start, end

    def prefill(self, caches, rows, chunks, hidden, finals, carries) -> None:
        lengths = [len(c) for c in chunks]
        width = max(lengths)
        if not width:
            return
        ids = mx.array([list(c) + [0] * (width - len(c)) for c in chunks], dtype=mx.uint32)
        prepare_chunk(caches, lengths)
        self.model(ids, cache=caches)
        commit(caches, lengths, width)

    def start(self, seq) -> None:
        seq.draft = ModelRow([seq.y])  # the first generated token, not yet seen by the drafter

    def filter(self, rows: list[int]) -> None:
        filter_rows(self.caches, rows)

    def draft(self, rows: list, depth: int) -> mx.array:
        pending = [r.draft.pending for r in rows]
        lengths = [len(p) for p in pending]
        width = max(lengths)
        padded = [p + p[-1:] * (width - len(p)) for p in pending]
        logits = self.model(mx.array(padded, dtype=mx.uint32), cache=self.caches)
        commit(self.caches, lengths, width)
        token = mx.argmax(_pick(logits, [n - 1 for n in lengths]), axis=-1).astype(mx.uint32)
        proposals = [token]
        for _ in range(depth - 1):
            token = mx.argmax(self.model(token, cache=self.caches)[:, -1:, :], axis=-1).astype(mx.uint32)
            proposals.append(token)
        return mx.concatenate(proposals, axis=1)

    def accept(self, rows, depth, accepted, sampled, drafts, hidden) -> None:
        # The drafter consumed its inputs and d1..d(k-1); d1..dn stand.
        s, d = sampled.tolist(), drafts.tolist()
        drop = []
        for row, n, s_row, d_row in zip(rows, accepted, s, d):
            if n == depth:
                row.draft = ModelRow([d_row[-1], s_row[depth]])  # dk was proposed but never consumed
                drop.append(0)
            else:
                row.draft = ModelRow([s_row[n]])
                drop.append(depth - 1 - n)
        for cache in self.caches:
            cache.rollback(drop)

    def skip(self, rows, sampled, hidden) -> None:
        """A step that drafted nothing: the draft model reads its new tokens with its next draft."""
        for row, token in zip(rows, sampled[:, 0].tolist()):
            row.draft.pending.append(token)

    def arrays(self, rows: list) -> list:
        return []
