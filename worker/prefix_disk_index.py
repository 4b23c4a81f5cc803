"""The disk tier's index: which nodes are on disk (read from their headers at start, kept in memory
after), the walk a lookup takes through them, and eviction under the byte budget.

Least recently used out first, as the memory tier evicts: an inner point loses its end state (its
stretch serves the nodes below it), a leaf goes whole with the ancestors it leaves useless, and a
chain is ordered from the root down, message boundaries last. Other validities' files count against
the budget too and are the first to go. The index only says which files to remove; the tier removes
them (`mtpstack.worker.prefix_disk`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from mtpstack.worker.prefix_disk_format import (KV_SUFFIX, STATE_SUFFIX, TMP_SUFFIX, BadEntry, chain_key, is_folder_name,
                                                parent_of, read_header)


@dataclass
class Entry:
    """One node on disk: its stretch (`<key>.kv`) and, while it is a resumable point, its end state (`<key>.st`)."""

    key: bytes
    parent: bytes | None
    start: int
    length: int
    kv_size: int
    state_size: int = 0  # 0: no end state on disk
    boundary: bool = False  # it ends at a message boundary (`prefix_cache.Stretch.boundary`)

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def resumable(self) -> bool:
        return self.state_size > 0


@dataclass
class DiskHit:
    """The deepest snapshot on disk a prompt begins with: the chain of entries from the root to it."""

    length: int
    chain: list[Entry]


@dataclass
class DiskStats:
    hits: int = 0
    writes: int = 0
    evictions: int = 0
    errors: int = 0
    bytes: int = 0
    entries: int = 0
    dropped: int = 0  # writes not made: the backlog was full or the directory not writable
    read_bytes: int = 0  # bytes of snapshots read back (a restore's throughput: over its seconds)
    write_seconds: float = 0.0  # the tier's thread writing files, their syncs included
    sync_seconds: float = 0.0  # of which syncing them (the files' and their folders' fsyncs)
    written_bytes: int = 0
    restore_seconds: list[float] = field(default_factory=list)  # drained by the metrics


class DiskIndex:
    """The entries of one validity in `folder`, and the files of the others beside it, against
    `max_bytes` in all. Its methods are called with `lock` held (or by the tier's opening, alone)."""

    def __init__(self, folder: Path, max_bytes: int, stats: DiskStats):
        self.folder = folder
        self.max_bytes = max_bytes
        self.stats = stats
        self.lock = threading.Lock()
        self.entries: dict[bytes, Entry] = {}
        self._lengths: dict[bytes | None, dict[int, int]] = {}  # parent -> child lengths -> how many
        self._children: dict[bytes | None, set[bytes]] = {}
        self.lru: OrderedDict[bytes, None] = OrderedDict()  # resumable entries, least recently used first
        self._foreign: list[tuple[float, Path, int]] = []  # (mtime, path, size), oldest first
        self._foreign_bytes = 0
        self.queued: dict[tuple[bytes, bool], int] = {}  # (key, has state) -> bytes of a write not done yet
        self.queued_bytes = 0

    @property
    def total_bytes(self) -> int:
        """Bytes counted against the budget: this validity's entries and every other's."""
        return self.stats.bytes + self._foreign_bytes

    def path(self, key: bytes, suffix: str) -> Path:
        return self.folder / (key.hex() + suffix)

    # -- built from the directory --------------------------------------------------------------

    def scan(self, root: Path) -> tuple[list[Path], list[tuple[Path, Exception]]]:
        """Index `folder`'s entries (headers only) and the other validities' files under `root`. Returns
        the files to remove (unfinished writes, what can never be restored) and the bad ones, with why."""
        self._scan_foreign(root)
        doomed, bad, kvs, states = [], [], [], []
        for f in self.folder.iterdir():
            if f.name.endswith(TMP_SUFFIX):
                doomed.append(f)  # a write that never finished (a kill -9 mid-write)
            elif f.suffix in (KV_SUFFIX, STATE_SUFFIX):
                try:
                    header, size = read_header(f)
                    if header["key"] != f.stem:
                        raise BadEntry("its name is not its key")
                    (kvs if f.suffix == KV_SUFFIX else states).append((f.stat().st_mtime_ns, header, size, f))
                except (OSError, BadEntry, ValueError, KeyError, TypeError) as e:
                    bad.append((f, e))
        for _, header, size, _ in kvs:
            self.add_kv(bytes.fromhex(header["key"]), parent_of(header), int(header["start"]), len(header["tokens"]), size,
                        bool(header.get("boundary")))
        for _, header, size, f in sorted(states, key=lambda t: t[0]):  # the recency a restart orders by
            key = bytes.fromhex(header["key"])
            if key in self.entries:
                self.add_state(key, size)
            else:
                doomed.append(f)
        # What can never be restored goes: entries below a missing parent, stretches with nothing below or at their end.
        orphans = [e.key for e in self.entries.values() if e.parent is not None and e.parent not in self.entries]
        doomed += [p for key in orphans for p in self.drop_subtree(key)]
        for e in list(self.entries.values()):
            if e.key in self.entries and not e.resumable and not self._children.get(e.key):
                doomed += self.prune(e.key)
        return doomed, bad

    def _scan_foreign(self, root: Path) -> None:
        for child in root.iterdir():
            if child == self.folder or not child.is_dir() or not is_folder_name(child.name):
                continue
            for f in child.iterdir():
                if f.suffix in (KV_SUFFIX, STATE_SUFFIX) or f.name.endswith(TMP_SUFFIX) or f.name in ("id", "validity.json"):
                    try:
                        st = f.stat()
                    except OSError:
                        continue
                    self._foreign.append((st.st_mtime, f, st.st_size))
                    self._foreign_bytes += st.st_size
        self._foreign.sort(key=lambda t: t[0])

    # -- entries in and out --------------------------------------------------------------------

    def add_kv(self, key: bytes, parent: bytes | None, start: int, length: int, size: int, boundary: bool) -> None:
        if key in self.entries:
            return
        self.entries[key] = Entry(key, parent, start, length, size, boundary=boundary)
        lengths = self._lengths.setdefault(parent, {})
        lengths[length] = lengths.get(length, 0) + 1
        self._children.setdefault(parent, set()).add(key)
        self.stats.bytes += size
        self.stats.entries += 1

    def add_state(self, key: bytes, size: int) -> None:
        entry = self.entries[key]
        self.stats.bytes += size - entry.state_size
        entry.state_size = size
        self.lru[key] = None
        self.lru.move_to_end(key)

    def _forget(self, key: bytes) -> list[Path]:
        entry = self.entries.pop(key)
        siblings = self._children.get(entry.parent)
        if siblings is not None:
            siblings.discard(key)
        lengths = self._lengths.get(entry.parent, {})
        lengths[entry.length] = lengths.get(entry.length, 1) - 1
        if lengths[entry.length] <= 0:
            lengths.pop(entry.length, None)
        self.lru.pop(key, None)
        self.stats.bytes -= entry.kv_size + entry.state_size
        self.stats.entries -= 1
        return [self.path(key, KV_SUFFIX)] + ([self.path(key, STATE_SUFFIX)] if entry.resumable else [])

    def drop_subtree(self, key: bytes) -> list[Path]:
        """Forget `key` and every entry below it (nothing below can be restored without it)."""
        paths, stack = [], [key]
        while stack:
            k = stack.pop()
            if k in self.entries:
                stack.extend(self._children.pop(k, ()))
                self._lengths.pop(k, None)
                paths += self._forget(k)
        return paths

    def prune(self, key: bytes | None) -> list[Path]:
        """Forget `key` if it can no longer be resumed from or lead anywhere, then each ancestor left so."""
        paths = []
        while key is not None and key in self.entries:
            entry = self.entries[key]
            if entry.resumable or self._children.get(key):
                break
            self._children.pop(key, None)
            self._lengths.pop(key, None)
            paths += self._forget(key)
            key = entry.parent
        return paths

    # -- lookups and recency ---------------------------------------------------------------------

    def find(self, prompt: list[int], min_length: int = 0) -> DiskHit | None:
        """The deepest snapshot (an entry with its end state) whose tokens begin `prompt` and that
        resumes further than `min_length`, touched as used; or None."""
        chain, key, pos = [], None, 0
        while pos < len(prompt):
            step = None
            for n in sorted(self._lengths.get(key, {}), reverse=True):
                if pos + n <= len(prompt) and (k := chain_key(key, prompt[pos: pos + n])) in self.entries:
                    step = self.entries[k]
                    break
            if step is None:
                break
            chain.append(step)
            key, pos = step.key, step.end
        while chain and not chain[-1].resumable:
            chain.pop()
        if not chain or chain[-1].end <= min_length:
            return None
        self.touch_chain(chain)
        return DiskHit(chain[-1].end, chain)

    def touch_chain(self, chain: list[Entry]) -> None:
        """Used now, as the memory tier orders an insert: from the root down, so a conversation's inner
        points lose their end states before its deepest one, and its message boundaries last of all
        (the snapshot one token before a prompt's end serves only an exact repeat)."""
        for boundary in (False, True):
            for entry in chain:
                if entry.boundary == boundary and entry.key in self.lru:
                    self.lru.move_to_end(entry.key)

    def chain(self, key: bytes | None) -> list[Entry]:
        chain = []
        while key is not None and key in self.entries:
            chain.append(self.entries[key])
            key = self.entries[key].parent
        return chain[::-1]

    # -- the budget ------------------------------------------------------------------------------

    def _evict_one(self, protected: set[bytes]) -> list[Path] | None:
        """The least recently used resumable point: an inner one (or one in `protected`, the chain a
        write hangs below) loses only its end state, its stretch serving what is below it; a leaf goes
        whole, with the ancestors it leaves useless. The files to remove; None when nothing is left."""
        if not self.lru:
            return None
        key, _ = self.lru.popitem(last=False)
        entry = self.entries[key]
        self.stats.evictions += 1
        self.stats.bytes -= entry.state_size
        entry.state_size = 0
        paths = [self.path(key, STATE_SUFFIX)]
        if self._children.get(key) or key in protected:
            return paths
        return paths + self.prune(key)

    def room(self, size: int, keep: bytes | None = None) -> list[Path]:
        """Other validities' files first, then this one's least recently used points (never `keep`
        or what is above it), until `size` more bytes fit the budget: the files to remove."""
        doomed: list[Path] = []
        while self.total_bytes + size > self.max_bytes and self._foreign:
            _, path, n = self._foreign.pop(0)
            self._foreign_bytes -= n
            self.stats.evictions += 1
            doomed.append(path)
        protected = {e.key for e in self.chain(keep)}
        if self.total_bytes + size > self.max_bytes:
            # Stretches with neither an end state nor anything below (their state's write was dropped)
            # lead nowhere: they go before any snapshot does.
            queued = {k for k, _ in self.queued}
            for key in [k for k, e in self.entries.items() if not e.resumable and not self._children.get(k)
                        and k not in protected and k not in queued]:
                doomed += self.prune(key)
        while self.total_bytes + size > self.max_bytes:
            paths = self._evict_one(protected)
            if paths is None:
                break
            doomed += paths
        return doomed
