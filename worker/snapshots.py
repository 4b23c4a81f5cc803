"""The prefill batch's way to the prefix cache: resume a row from a hit, snapshot it along its prompt,
store its snapshots once the prompt is in.

The only code that copies a row's caches into the prefix cache (`take`: the attention and drafter
entries over the stretch since the row's last snapshot, the recurrent state and the last hidden
state at its end) or out of it (`resume`: the stretches from the root joined, the state at the hit's
end). A row's snapshots wait here until its whole prompt is in (`store`); a prefill that does not
complete leaves nothing behind (`forget`). The prefix cache itself (`mtpstack.worker.prefix_cache`)
keeps the tree and the budget and knows nothing of caches or rows.

With a disk tier, a prompt whose deepest snapshot is on disk and not in memory waits (`ready`)
while the tier's thread reads it; every other row goes on meanwhile. The chain read back goes into
memory (the next turn finds it there) and the row resumes from it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import mlx.core as mx

from mtpstack.worker.prefix_cache import Hit, Node, PrefixCache, Stretch
from mtpstack.worker.prefix_disk import DiskHit, to_mlx
from mtpstack.worker.sequence import Sequence


@dataclass
class _Row:
    """A prefilling row's way into the cache: the node it resumed from, where its last snapshot ended, the snapshots since."""

    resumed: Node | None
    since: int
    stretches: list[Stretch] = field(default_factory=list)


@dataclass
class _Fetch:
    """A read from the disk tier a sequence waits for: the chain found, the stretches memory holds of it."""

    hit: DiskHit
    held: list[Stretch]
    future: Future
    asked: float


class Snapshots:
    """Snapshots of the prefilling rows of one batch, for one prefix cache (None, or a budget of 0: off)."""

    def __init__(self, cache: PrefixCache | None, kinds: list[str]):
        self.cache = cache
        self.kinds = kinds  # the target's cache kinds, layer by layer
        self._rows: dict[Sequence, _Row] = {}
        self._fetching: dict[Sequence, _Fetch] = {}

    def ready(self, seq: Sequence) -> bool:
        """Whether `seq` may start its prefill: not while a snapshot deeper than memory's is read from
        disk for it (the first call starts that read)."""
        disk = self.cache.disk if self.cache is not None else None
        if disk is None:
            return True
        fetch = self._fetching.get(seq)
        if fetch is not None:
            return fetch.future.done()
        path = self.cache.walk(seq.prompt)
        in_memory = max((n.end for n in path if n.resumable), default=0)
        hit = disk.find(seq.prompt, min_length=in_memory)
        if hit is None:
            return True
        held = []
        for node, entry in zip(path, hit.chain):
            if node.key != entry.key:
                break
            held.append(node.stretch)  # kept alive here, even if memory evicts it before the read ends
        self._fetching[seq] = _Fetch(hit, held, disk.load(hit, seq.prompt, skip=len(held)), time.monotonic())
        return False

    def waiting(self) -> bool:
        return bool(self._fetching)

    def wait(self, timeout: float) -> None:
        """Block up to `timeout` for any read a sequence waits for (when no row has anything else to do)."""
        for fetch in list(self._fetching.values()):
            try:
                fetch.future.result(timeout)
            except Exception:
                pass
            return

    @property
    def enabled(self) -> bool:
        return self.cache is not None and self.cache.enabled

    def resume(self, seq: Sequence) -> tuple[list | None, list | None]:
        """`seq` resumed from the deepest snapshot its prompt begins with: its rows of the target's and
        the drafter's caches there (`caches.add_row` takes them), or (None, None) without a hit."""
        fetch = self._fetching.pop(seq, None)
        hit = self._from_disk(seq, fetch) if fetch is not None and fetch.future.done() else None
        if hit is None and self.cache is not None:
            hit = self.cache.lookup(seq.prompt)
        self._rows[seq] = _Row(resumed=hit.node if hit is not None else None, since=hit.length if hit is not None else 0)
        if hit is None:
            return None, None
        target, draft, carry = _restore(hit, self.kinds)
        seq.resume(hit.length, carry)
        return target, draft

    def take(self, r: int, seq: Sequence, caches: list, draft_caches: list, drafter) -> None:
        """Row r's stretch since its last snapshot, when its prompt is in up to a snapshot point: the
        attention and drafter entries over it (`drafter.span`), the state and `seq.carry` at its end."""
        row = self._rows[seq]
        if not self.enabled or not seq.snapshot_due(row.since):
            return
        start, end = row.since, seq.prefilled
        row.since = end
        target = [c.segment(r, start, end) if kind == "kv" else None for c, kind in zip(caches, self.kinds)]
        draft = [c.segment(r, *drafter.span(start, end)) for c in draft_caches] if drafter is not None else []
        states = [None if kind == "kv" else c.row(r) for c, kind in zip(caches, self.kinds)]
        stretch = Stretch(tokens=tuple(seq.prompt[start:end]), segment=(target, draft),
                          end_state=(states, mx.contiguous(seq.carry)), boundary=end in seq.snapshot_at)
        # Copied now: left lazy, each slice would keep this step's whole buffers alive (the batch's
        # KV over every row and position, the chunk's hidden states) until a hit evaluated it, and the
        # cache would hold several times what it counts.
        mx.eval(stretch.segment, stretch.end_state)
        row.stretches.append(stretch)

    def store(self, seq: Sequence) -> None:
        """`seq`'s whole prompt is in: its snapshots go into the prefix cache, below where it resumed."""
        row = self._rows.pop(seq)
        if self.cache is not None:
            self.cache.insert(row.resumed, row.stretches)

    def forget(self, seq: Sequence) -> None:
        """`seq` left before its prompt was in: its snapshots go with it (a read it waited for is left to finish)."""
        self._rows.pop(seq, None)
        self._fetching.pop(seq, None)

    def _from_disk(self, seq: Sequence, fetch: _Fetch) -> Hit | None:
        """The hit a read from disk gives, its chain put into memory (None: the read found a bad or
        missing entry; the row then resumes from what memory has)."""
        loaded = fetch.future.result()
        if loaded is None:
            return None
        chain, held = fetch.hit.chain, fetch.held
        stretches = []
        for i, entry in enumerate(chain):
            last = i == len(chain) - 1
            segment = held[i].segment if i < len(held) else to_mlx(loaded.segments[i])
            end_state = to_mlx(loaded.end_state) if last else None
            if i < len(held) and not last:
                stretches.append(held[i])
            else:
                stretches.append(Stretch(tokens=loaded.tokens[i], segment=segment, end_state=end_state, boundary=entry.boundary))
        mx.eval([s.segment for s in stretches[len(held):]], stretches[-1].end_state)  # on this thread: mlx's only
        self.cache.insert(None, stretches)  # the next turn finds it in memory
        hit = self.cache.lookup(seq.prompt)
        if hit is None or hit.length < fetch.hit.length:
            # Memory could not keep it (a chain larger than its budget): resume from the chain as read.
            # Its node belongs to no tree, so the row's own snapshots will not be kept below it.
            nodes, parent = [], None
            for st, entry in zip(stretches, chain):
                parent = Node(parent=parent, start=entry.start, stretch=st, key=entry.key)
                nodes.append(parent)
            hit = Hit(fetch.hit.length, nodes)
        self.cache.disk.observe_restore(time.monotonic() - fetch.asked)
        return hit


def _restore(hit: Hit, kinds: list[str]) -> tuple[list[tuple], list[tuple], mx.array]:
    """A row's caches at a prefix-cache hit: the stretches' entries joined, the state at its end."""
    segments = hit.segments
    states, carry = hit.end_state

    def joined(layer: int, which: int) -> tuple:
        parts = [seg[which][layer] for seg in segments if seg[which][layer][0] is not None]
        if not parts:
            return None, None
        return (mx.concatenate([p[0] for p in parts], axis=2), mx.concatenate([p[1] for p in parts], axis=2))

    target = [joined(i, 0) if kind == "kv" else states[i] for i, kind in enumerate(kinds)]
    draft = [joined(j, 1) for j in range(len(segments[0][1]))]
    return target, draft, carry
