"""The prefill batch's way to the prefix cache: resume a row from a hit, snapshot it along its prompt,
store its snapshots once the prompt is in.

The only code that copies a row's caches into the prefix cache (`take`: the attention and drafter
entries over the stretch since the row's last snapshot, the recurrent state and the last hidden
state at its end) or out of it (`resume`: the stretches from the root joined, the state at the hit's
end). A row's snapshots wait here until its whole prompt is in (`store`); a prefill that does not
complete leaves nothing behind (`forget`). The prefix cache itself (`mtpstack.worker.prefix_cache`)
keeps the tree and the budget and knows nothing of caches or rows.

With a disk tier, a prompt whose deepest snapshot is on disk and not in memory waits (`ready`)
while the tier's thread reads it and makes its mlx arrays (`prefix_disk_format.in_mlx`); every other row
goes on meanwhile. The chain read back goes into memory (the next turn finds it there) and the row
resumes from it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import mlx.core as mx

from mtpstack.worker.prefix_cache import Hit, Node, PrefixCache, Stretch
from mtpstack.worker.prefix_disk_format import in_mlx
from mtpstack.worker.prefix_disk_index import DiskHit
from mtpstack.worker.sequence import Sequence


@dataclass
class _Row:
    """A prefilling row's way into the cache: the stretches from the root to where it resumed, where
    its last snapshot ended, the snapshots since."""

    prefix: list[Stretch]
    since: int
    stretches: list[Stretch] = field(default_factory=list)

    def chain(self, upto: int) -> list[Stretch]:
        """The deepest beginning of its chain (prefix and snapshots) ending in a resumable point at or
        before `upto`; empty when there is none."""
        chain, end, best = self.prefix + self.stretches, 0, 0
        for i, stretch in enumerate(chain):
            end += len(stretch.tokens)
            if end > upto:
                break
            if stretch.end_state is not None:
                best = i + 1
        return chain[:best]


@dataclass
class _Fetch:
    """A read from the disk tier a sequence waits for: the chain found, the stretches memory holds of it."""

    hit: DiskHit
    held: list[Stretch]
    future: Future
    asked: float


def shared_length(a: list[int], b: list[int]) -> int:
    """How many first tokens `a` and `b` have in common (list slices compare at C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class Snapshots:
    """Snapshots of the prefilling rows of one batch, for one prefix cache (None, or a budget of 0: off).

    A prompt that shares its beginning with a row being prefilled is prefilled once: it waits
    (`ready`) until that row has snapshotted the deepest point they share beyond what it could
    resume from now, then resumes from the row's own snapshots (`resume`), whether or not they are
    in the cache yet, and whether or not there is a cache (`n` choices of one request: one prefill,
    the others resume one token before its end and all start in the same step)."""

    def __init__(self, cache: PrefixCache | None, kinds: list[str]):
        self.cache = cache
        self.kinds = kinds  # the target's cache kinds, layer by layer
        self._rows: dict[Sequence, _Row] = {}
        self._fetching: dict[Sequence, _Fetch] = {}
        #: Rows others wait for, and how many: they snapshot even without a cache.
        self._followed: dict[Sequence, set[Sequence]] = {}

    @property
    def enabled(self) -> bool:
        return self.cache is not None and self.cache.enabled

    def taking(self, seq: Sequence) -> bool:
        """Whether `seq`'s prefill stops at its snapshot points: a cache takes them, or a follower."""
        return self.enabled or bool(self._followed.get(seq))

    def ready(self, seq: Sequence) -> bool:
        """Whether `seq` may start its prefill: not while a row being prefilled has yet to reach a point
        they share beyond where `seq` could resume now, nor while a snapshot deeper than memory's is
        read from disk for it (the first call starts that read)."""
        fetch = self._fetching.get(seq)
        if fetch is not None:
            return fetch.future.done()
        path = self.cache.walk(seq.prompt) if self.cache is not None else []
        now = max((n.end for n in path if n.resumable), default=0)
        now = max(now, self._in_flight(seq, now)[0])
        leader = self._leader(seq, now)
        for followed in self._followed.values():
            followed.discard(seq)
        if leader is not None:
            self._followed.setdefault(leader, set()).add(seq)
            return False
        disk = self.cache.disk if self.cache is not None else None
        if disk is None:
            return True
        hit = disk.find(seq.prompt, min_length=now)
        if hit is None:
            return True
        held = []
        for node, entry in zip(path, hit.chain):
            if node.key != entry.key:
                break
            held.append(node.stretch)  # kept alive here, even if memory evicts it before the read ends
        self._fetching[seq] = _Fetch(hit, held, disk.load(hit, seq.prompt, skip=len(held), convert=in_mlx), time.monotonic())
        return False

    def _in_flight(self, seq: Sequence, floor: int) -> tuple[int, list[Stretch]]:
        """The deepest point beyond `floor` that a row being prefilled has snapshotted and `seq`'s
        prompt begins with, and the chain to it; (0, []) when there is none."""
        best: tuple[int, list[Stretch]] = (0, [])
        for other, row in self._rows.items():
            if other is seq or other.finished:
                continue
            chain = row.chain(min(shared_length(seq.prompt, other.prompt), len(seq.prompt) - 1))
            end = sum(len(s.tokens) for s in chain)
            if end > max(floor, best[0]):
                best = (end, chain)
        return best

    def _leader(self, seq: Sequence, now: int) -> Sequence | None:
        """A row being prefilled that will snapshot a point `seq`'s prompt begins with, deeper than
        `now`, and has not yet: the one whose point is deepest."""
        best, deepest = None, now
        for other, row in self._rows.items():
            if other is seq or other.finished:
                continue
            shared = shared_length(seq.prompt, other.prompt)
            points = other.snapshot_points(max(row.since, now), min(shared, len(seq.prompt) - 1 if len(seq.prompt) > 1 else 0))
            if points and points[-1] > deepest:
                best, deepest = other, points[-1]
        return best

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

    def resume(self, seq: Sequence) -> tuple[list | None, list | None]:
        """`seq` resumed from the deepest snapshot its prompt begins with (from disk, the cache, or a
        row being prefilled): its rows of the target's and the drafter's caches there (`caches.add_row`
        takes them), or (None, None) without one."""
        fetch = self._fetching.pop(seq, None)
        for followed in self._followed.values():
            followed.discard(seq)
        hit = self._from_disk(seq, fetch) if fetch is not None and fetch.future.done() else None
        if hit is None and self.cache is not None:
            hit = self.cache.lookup(seq.prompt)
        end, chain = self._in_flight(seq, hit.length if hit is not None else 0)
        if chain:
            if self.cache is not None:
                self.cache.joined(hit.length if hit is not None else None, end)
            hit = _detached(chain, end)
        prefix = [n.stretch for n in hit.path] if hit is not None else []
        self._rows[seq] = _Row(prefix=prefix, since=hit.length if hit is not None else 0)
        if hit is None:
            return None, None
        target, draft, carry = _restore(hit, self.kinds)
        seq.resume(hit.length, carry)
        return target, draft

    def take(self, r: int, seq: Sequence, caches: list, draft_caches: list, drafter) -> None:
        """Row r's stretch since its last snapshot, when its prompt is in up to a snapshot point: the
        attention and drafter entries over it (`drafter.span`), the state and `seq.carry` at its end."""
        row = self._rows[seq]
        if not self.taking(seq) or not seq.snapshot_due(row.since):
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
        """`seq`'s whole prompt is in: its snapshots go into the prefix cache, with the stretches it
        resumed from (already there, unless evicted meanwhile or still a row's own)."""
        row = self._rows.pop(seq)
        self._followed.pop(seq, None)
        if self.cache is not None:
            self.cache.insert(None, row.prefix + row.stretches)

    def forget(self, seq: Sequence) -> None:
        """`seq` left before its prompt was in: its snapshots go with it (a read it waited for is left to finish)."""
        self._rows.pop(seq, None)
        self._fetching.pop(seq, None)
        self._followed.pop(seq, None)
        for followed in self._followed.values():
            followed.discard(seq)

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
            segment = held[i].segment if i < len(held) else loaded.segments[i]  # mlx, evaluated on the tier's thread
            end_state = loaded.end_state if last else None
            if i < len(held) and not last:
                stretches.append(held[i])
            else:
                stretches.append(Stretch(tokens=loaded.tokens[i], segment=segment, end_state=end_state, boundary=entry.boundary))
        self.cache.insert(None, stretches)  # the next turn finds it in memory
        hit = self.cache.lookup(seq.prompt)
        if hit is None or hit.length < fetch.hit.length:
            hit = _detached(stretches, fetch.hit.length)  # memory could not keep it: resume from the chain as read
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


def _detached(chain: list[Stretch], length: int) -> Hit:
    """A hit on a chain of stretches that are in no tree (a row's own, or read from disk)."""
    nodes, parent, start = [], None, 0
    for stretch in chain:
        parent = Node(parent=parent, start=start, stretch=stretch)
        nodes.append(parent)
        start += len(stretch.tokens)
    return Hit(length, nodes)
