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
engine's batch; each sequence prefills into caches of its own first
(`new_cache`, `prefill`), which `extend` then appends as a row. Every
proposal is the drafter's argmax: the engine's acceptance rule (a draft stands
when it equals the target's own sample) keeps the target's distribution
whatever is proposed.
"""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mtpstack.worker.caches import RaggedKVCache, batch_caches


class Drafter(Protocol):
    kind: str
    caches: list

    def new_cache(self) -> list: ...
    def prefill(self, seq, tokens: list[int], hidden: mx.array, bonus: mx.array | None) -> None: ...
    def start(self, seq) -> None: ...
    def extend(self, seq) -> None: ...
    def filter(self, rows: list[int]) -> None: ...
    def draft(self, rows: list, depth: int) -> mx.array: ...
    def accept(self, rows: list, depth: int, accepted: list[int], sampled: mx.array, drafts: mx.array, hidden: mx.array) -> None: ...


def _extend(caches: list, own: list) -> None:
    for batch, single in zip(caches, own):
        batch.extend(single)


def _filter(caches: list, rows: list[int]) -> None:
    for batch in caches:
        batch.filter(rows)


def _pick(x: mx.array, index: list[int]) -> mx.array:
    """Row r's position `index[r]` of x [rows, T, ...] -> [rows, 1, ...]."""
    at = mx.array(index, dtype=mx.int32).reshape((-1, 1) + (1,) * (x.ndim - 2))
    return mx.take_along_axis(x, at, axis=1)


class HeadDrafter:
    kind = "mtp"

    def __init__(self, head, target_parts):
        self.head = head
        self.parts = target_parts
        self.caches = [RaggedKVCache() for _ in head.layers]

    def new_cache(self) -> list:
        return self.head.make_cache()

    def _seed(self, out: mx.array) -> tuple[mx.array, mx.array]:
        """The next step's first proposal and the head state it came from, from head outputs [rows, 1, H]."""
        return mx.argmax(self.parts.lm_head(out), axis=-1).astype(mx.uint32), out

    def prefill(self, seq, tokens: list[int], hidden: mx.array, bonus: mx.array | None) -> None:
        """Head entries for one prompt chunk: position t pairs token t+1 with the target's hidden state at t.

        `tokens` is the chunk plus the prompt's next token when there is one; after the
        last chunk `bonus` (the first generated token) takes that place.
        """
        nxt = mx.array(tokens[1:], dtype=mx.uint32)  # `tokens` runs one past the chunk where the prompt does
        if bonus is not None:  # the prompt's last position pairs with the first generated token
            nxt = mx.concatenate([nxt, bonus.reshape(-1).astype(mx.uint32)])
        if nxt.size == 0:
            return
        out = self.head(self.parts.embed(nxt[None]), hidden, seq.draft_cache)
        if bonus is not None:
            seq.seed, seq.seed_hidden = self._seed(out[:, -1:, :])

    def start(self, seq) -> None:
        pass  # the seed was made by the last prefill chunk

    def extend(self, seq) -> None:
        _extend(self.caches, seq.draft_cache)

    def filter(self, rows: list[int]) -> None:
        _filter(self.caches, rows)

    def draft(self, rows: list, depth: int) -> mx.array:
        token = mx.concatenate([r.seed.reshape(1, 1) for r in rows])
        state = mx.concatenate([r.seed_hidden for r in rows])
        proposals = [token]
        for _ in range(depth - 1):
            state = self.head(self.parts.embed(token), state, self.caches)
            token = mx.argmax(self.parts.lm_head(state), axis=-1).astype(mx.uint32)
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
        out = self.head(self.parts.embed(row_tokens), states, self.caches)
        for cache in self.caches:
            cache.rollback([width - n for n in lengths])
        seeds, seed_states = self._seed(_pick(out, [n - 1 for n in lengths]))
        for i, row in enumerate(rows):
            row.seed, row.seed_hidden = seeds[i : i + 1], seed_states[i : i + 1]


class ModelDrafter:
    kind = "model"

    def __init__(self, model, cache_kinds: list[str]):
        if any(kind != "kv" for kind in cache_kinds):
            raise ValueError("a separate draft model must keep plain KV caches (its rejected drafts are rolled back by length)")
        self.model = model
        self.caches = batch_caches(cache_kinds)

    def new_cache(self) -> list:
        return make_prompt_cache(self.model)

    def prefill(self, seq, tokens: list[int], hidden: mx.array, bonus: mx.array | None) -> None:
        chunk = tokens[: hidden.shape[1]]  # the lookahead token belongs to the next chunk
        self.model(mx.array(chunk, dtype=mx.uint32)[None], cache=seq.draft_cache)

    def start(self, seq) -> None:
        seq.draft_y = [seq.y]  # the first generated token, not yet seen by the drafter

    def extend(self, seq) -> None:
        _extend(self.caches, seq.draft_cache)

    def filter(self, rows: list[int]) -> None:
        _filter(self.caches, rows)

    def draft(self, rows: list, depth: int) -> mx.array:
        lengths = [len(r.draft_y) for r in rows]
        width = max(lengths)
        padded = [r.draft_y + r.draft_y[-1:] * (width - len(r.draft_y)) for r in rows]
        logits = self.model(mx.array(padded, dtype=mx.uint32), cache=self.caches)
        for cache in self.caches:
            cache.commit(lengths, width)
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
                row.draft_y = [d_row[-1], s_row[depth]]  # dk was proposed but never consumed
                drop.append(0)
            else:
                row.draft_y = [s_row[n]]
                drop.append(depth - 1 - n)
        for cache in self.caches:
            cache.rollback(drop)
