"""The prefix cache's disk tier: snapshots kept on disk under a byte budget, valid across restarts.

The memory tier (`mtpstack.worker.prefix_cache`) keeps a tree of stretches; this keeps the same
stretches as files, two per node: its stretch (`<key>.kv`: its tokens and the attention and
drafter entries over them) and, while it is a resumable point, its end state (`<key>.st`). The key
chains the node's tokens to its parent's (`chain_key`), so a node stands for exactly one prefix of
tokens and a lookup walks the prompt the way the memory tree does, by keys instead of nodes.
Restoring a snapshot reads the stretches of its node and of every node above it (joined, they are
the prefix's caches) and its node's end state.

Validity. Entries are valid only for what produced them: `facts` (the content digests of the
target and the drafter, their dtypes, quantization and kind, the mlx, mlx-lm and mtpstack
versions) and `LAYOUT`, hashed into the name of the folder they live in (`v<LAYOUT>-<hash>`, with
the facts in its `validity.json`). Another folder's entries are never read; they are the first
removed when space is needed. Nothing else in the directory is ever touched: only names this
module makes.

Budget. Least recently used out first, as the memory tier evicts: an inner point loses its end
state (its stretch serves the nodes below it), a leaf goes whole with the ancestors it leaves
useless, and a chain is ordered from the root down, message boundaries last.

Format (`LAYOUT` 1), each file: `MAGIC`, the header's length and CRC-32 (two little-endian u32),
the header (JSON: the key, for a stretch its parent, start and tokens; the tree's skeleton, each
array's dtype, shape and offset, and the arrays' CRC-32), then the arrays' bytes. A reader checks
everything it reads. Every file (the entries, the folder's `id` and `validity.json`) is written
under a temporary name, synced (`fsync`; on macOS `F_FULLFSYNC`, which also empties the drive's
cache), renamed and the renames synced in their folder, so a name holds a whole file through a
power cut too. The tier's thread writes the files of the snapshots queued together, then syncs
and renames them as one batch (`_commit`: one folder sync for all, before any read and at most
`COMMIT_BYTES` apart); the index counts them as soon as they are written. A `kill -9` or power cut
mid-batch leaves only temporary files, removed at the next start. A short, torn, corrupt or
foreign file (a filesystem that reorders writes can still leave one) is a miss: counted
(`errors`), logged (the first `LOGGED_BAD_ENTRIES`), removed with the entries below it.

Threads. The generation thread calls `find` (the index, in memory) and `store`/`load`, which
queue work for the tier's own thread and never block: writes copy nothing (the arrays' buffers,
already evaluated, are written as they are) and are dropped when the backlog passes
`pending_bytes`; a read hands back its arrays through a `Future`, as numpy arrays or, asked to
(`load(convert=in_mlx)`, as the worker asks), as mlx arrays made and evaluated on the tier's thread,
so that a restore costs the generation thread no copy: it only joins them. Reads go before writes.

Failures are never errors for a request: a directory that cannot be written (read-only, full, no
permission) is a warning and the worker serves from memory (a full disk is retried after
`RETRY_SECONDS`); one that cannot be read turns the tier off.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import logging
import os
import queue
import secrets
import struct
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger("mtpstack.worker")

#: The file layout's version: part of every entry's validity, so a change of format never reads old files.
LAYOUT = 1
MAGIC = b"MTPSNAP\x01"
#: A node's stretch (its tokens, the attention and drafter entries over them) and its end state.
KV_SUFFIX = ".kv"
STATE_SUFFIX = ".st"
TMP_SUFFIX = ".tmp"
#: The folder of one validity: `v<LAYOUT>-` and 16 hex digits of the facts' hash.
FOLDER_PREFIX = "v"
#: Bytes of queued writes beyond which a new write is dropped (its snapshot stays in memory only).
PENDING_BYTES = 256 << 20
#: Bytes of written files the tier's thread syncs and renames at the latest as one batch.
COMMIT_BYTES = 64 << 20
#: A full disk is tried again after this long.
RETRY_SECONDS = 60.0
#: Bad entries logged one by one; after that only counted.
LOGGED_BAD_ENTRIES = 10
_PREFIX = struct.Struct("<II")
#: Numpy's view of each mlx dtype the caches hold; bfloat16 travels as its 16 bits.
_NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "float64": np.float64,
          "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
          "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "bool": np.bool_}


class BadEntry(Exception):
    """A file that is not a whole, valid entry of this tier."""


def chain_key(parent: bytes | None, tokens) -> bytes:
    """The key of the node holding `tokens` below the node keyed `parent` (None: the root): it stands
    for every token from the prompt's start to the node's end."""
    h = hashlib.sha256(b"root" if parent is None else parent)
    h.update(np.asarray(tokens, dtype="<u4").tobytes())
    return h.digest()[:16]


def validity_folder(facts: dict) -> str:
    digest = hashlib.sha256(json.dumps({"layout": LAYOUT, **facts}, sort_keys=True).encode()).hexdigest()
    return f"{FOLDER_PREFIX}{LAYOUT}-{digest[:16]}"


def _is_folder_name(name: str) -> bool:
    head, _, digest = name.partition("-")
    return head[:1] == FOLDER_PREFIX and head[1:].isdigit() and len(digest) == 16 and all(c in "0123456789abcdef" for c in digest)


def _dtype_name(array) -> str:
    return str(array.dtype).rsplit(".", 1)[-1]


def flatten(tree, leaves: list) -> object:
    """`tree` (nested lists/tuples of arrays and None) as a JSON skeleton: each array its index in `leaves`."""
    if tree is None:
        return None
    if isinstance(tree, (list, tuple)):
        return [flatten(t, leaves) for t in tree]
    leaves.append(tree)
    return len(leaves) - 1


def unflatten(skeleton, leaves: list) -> object:
    if skeleton is None:
        return None
    if isinstance(skeleton, list):
        return [unflatten(s, leaves) for s in skeleton]
    return leaves[skeleton]


@dataclass
class RawArray:
    """An array read from disk, not yet in mlx: numpy's bytes and the mlx dtype they are."""

    data: np.ndarray
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def to_mlx(tree):
    """A tree read from disk with mlx arrays at its leaves (a copy of each; bfloat16 viewed on the CPU)."""
    import mlx.core as mx

    if tree is None:
        return None
    if isinstance(tree, list):
        return [to_mlx(t) for t in tree]
    array = mx.array(tree.data)
    return array.view(getattr(mx, tree.dtype), stream=mx.cpu) if tree.dtype == "bfloat16" else array


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
class Loaded:
    """A chain read back: each entry's tokens and stretch (None where the caller holds it), the last one's end state."""

    tokens: list[tuple[int, ...]]
    segments: list[object]
    end_state: object


def in_mlx(loaded: "Loaded") -> "Loaded":
    """`loaded` with mlx arrays, evaluated on the thread that calls this (the tier's, through `load`'s
    `convert`): mlx (0.31.2 and later) gives each thread its own streams, and an array evaluated on one
    is an input like any other on the generation thread's, while an unevaluated one would not be."""
    import mlx.core as mx

    segments = [to_mlx(s) for s in loaded.segments]
    end_state = to_mlx(loaded.end_state)
    mx.eval(segments, end_state)
    return Loaded(loaded.tokens, segments, end_state)


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


@dataclass(order=True)
class _Job:
    priority: int
    order: int
    kind: str = field(compare=False)
    payload: object = field(compare=False, default=None)


class DiskTier:
    """Entries of one validity in `directory`, at most `max_bytes` in all (other validities' included)."""

    def __init__(self, directory: str | Path, max_bytes: int, facts: dict, *, pending_bytes: int = PENDING_BYTES):
        self.root = Path(directory)
        self.max_bytes = max(0, int(max_bytes))
        self.facts = dict(facts)
        self.folder = self.root / validity_folder(self.facts)
        self.pending_bytes = pending_bytes
        self.stats = DiskStats()
        #: A name for this cache that outlives the process: kept in its folder, new with the folder.
        self.cache_id: str | None = None
        self.enabled = False
        self.writable = False
        self._retry_at = 0.0
        self._lock = threading.Lock()
        self._entries: dict[bytes, Entry] = {}
        self._lengths: dict[bytes | None, dict[int, int]] = {}  # parent -> child lengths -> how many
        self._children: dict[bytes | None, set[bytes]] = {}
        self._lru: OrderedDict[bytes, None] = OrderedDict()  # resumable entries, least recently used first
        self._foreign: list[tuple[float, Path, int]] = []  # (mtime, path, size), oldest first
        self._foreign_bytes = 0
        self._queued: dict[tuple[bytes, bool], int] = {}  # (key, has state) -> bytes of a write not done yet
        self._queued_bytes = 0
        #: Files written under their temporary names since the last commit: (temporary, final, key, state or not, bytes).
        self._staged: list[tuple[Path, Path, bytes, bool, int]] = []
        self._staged_writes = 0
        self._jobs: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self._bad_logged = 0

    # -- opening --------------------------------------------------------------------------

    def open(self) -> "DiskTier":
        """Read the directory's index (headers only) and start the tier's thread. Never raises: a
        directory that cannot be used is a warning and the tier stays off."""
        if self.max_bytes <= 0:
            return self
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.folder.mkdir(exist_ok=True)
            self.writable = os.access(self.folder, os.W_OK)
        except OSError as e:
            self.writable = False
            if not self.folder.is_dir():
                self._warn("open", f"prefix cache: the disk tier is off: `{self.root}` cannot be used: {e.strerror or e}"
                           "\n\nhint: give `prefixCache.dir` a directory the worker may write, or set it to null")
                return self
        try:
            self._scan()
        except OSError as e:
            self._warn("open", f"prefix cache: the disk tier is off: `{self.folder}` cannot be read: {e.strerror or e}")
            return self
        if not self.writable:
            self._warn("readonly", f"prefix cache: `{self.folder}` is read-only: the snapshots on it are served, none are added")
        self._load_id()
        self.enabled = True
        for path in self._room(0):
            self._remove_file(path)
        self._thread = threading.Thread(target=self._run, name="prefix-disk", daemon=True)
        self._thread.start()
        return self

    def _load_id(self) -> None:
        path = self.folder / "id"
        try:
            self.cache_id = path.read_text().strip() or None
        except OSError:
            pass
        if self.cache_id is None:
            self.cache_id = secrets.token_hex(8)
            if self.writable:
                try:
                    _durable_write(path, [self.cache_id.encode()], self.stats)
                    _durable_write(self.folder / "validity.json",
                                   [json.dumps({"layout": LAYOUT, **self.facts}, indent=1, sort_keys=True).encode()], self.stats)
                except OSError:
                    pass

    def _scan(self) -> None:
        for child in self.root.iterdir():
            if child == self.folder or not child.is_dir() or not _is_folder_name(child.name):
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
        kvs, states = [], []
        for f in self.folder.iterdir():
            if f.name.endswith(TMP_SUFFIX):
                self._remove_file(f)  # a write that never finished (a kill -9 mid-write)
            elif f.suffix in (KV_SUFFIX, STATE_SUFFIX):
                try:
                    header, size = _read_header(f)
                    if header["key"] != f.stem:
                        raise BadEntry("its name is not its key")
                    (kvs if f.suffix == KV_SUFFIX else states).append((f.stat().st_mtime_ns, header, size, f))
                except (OSError, BadEntry, ValueError, KeyError, TypeError) as e:
                    self._bad(f, e)
        for _, header, size, _ in kvs:
            self._add_kv(bytes.fromhex(header["key"]), _parent(header), int(header["start"]), len(header["tokens"]), size,
                         bool(header.get("boundary")))
        for _, header, size, f in sorted(states, key=lambda t: t[0]):  # the recency a restart orders by
            key = bytes.fromhex(header["key"])
            if key in self._entries:
                self._add_state(key, size)
            else:
                self._remove_file(f)
        # What can never be restored goes: entries below a missing parent, stretches with nothing below or at their end.
        doomed = [e.key for e in self._entries.values() if e.parent is not None and e.parent not in self._entries]
        paths = [p for key in doomed for p in self._drop_subtree(key)]
        for e in list(self._entries.values()):
            if e.key in self._entries and not e.resumable and not self._children.get(e.key):
                paths += self._prune(e.key)
        for path in paths:
            self._remove_file(path)

    # -- the index (callers hold the lock, or own the tier alone) ------------------------------

    def _path(self, key: bytes, suffix: str) -> Path:
        return self.folder / (key.hex() + suffix)

    def _add_kv(self, key: bytes, parent: bytes | None, start: int, length: int, size: int, boundary: bool) -> None:
        if key in self._entries:
            return
        self._entries[key] = Entry(key, parent, start, length, size, boundary=boundary)
        lengths = self._lengths.setdefault(parent, {})
        lengths[length] = lengths.get(length, 0) + 1
        self._children.setdefault(parent, set()).add(key)
        self.stats.bytes += size
        self.stats.entries += 1

    def _add_state(self, key: bytes, size: int) -> None:
        entry = self._entries[key]
        self.stats.bytes += size - entry.state_size
        entry.state_size = size
        self._lru[key] = None
        self._lru.move_to_end(key)

    def _forget(self, key: bytes) -> list[Path]:
        entry = self._entries.pop(key)
        siblings = self._children.get(entry.parent)
        if siblings is not None:
            siblings.discard(key)
        lengths = self._lengths.get(entry.parent, {})
        lengths[entry.length] = lengths.get(entry.length, 1) - 1
        if lengths[entry.length] <= 0:
            lengths.pop(entry.length, None)
        self._lru.pop(key, None)
        self.stats.bytes -= entry.kv_size + entry.state_size
        self.stats.entries -= 1
        return [self._path(key, KV_SUFFIX)] + ([self._path(key, STATE_SUFFIX)] if entry.resumable else [])

    def _drop_subtree(self, key: bytes) -> list[Path]:
        """Forget `key` and every entry below it (nothing below can be restored without it)."""
        paths, stack = [], [key]
        while stack:
            k = stack.pop()
            if k in self._entries:
                stack.extend(self._children.pop(k, ()))
                self._lengths.pop(k, None)
                paths += self._forget(k)
        return paths

    def _prune(self, key: bytes | None) -> list[Path]:
        """Forget `key` if it can no longer be resumed from or lead anywhere, then each ancestor left so."""
        paths = []
        while key is not None and key in self._entries:
            entry = self._entries[key]
            if entry.resumable or self._children.get(key):
                break
            self._children.pop(key, None)
            self._lengths.pop(key, None)
            paths += self._forget(key)
            key = entry.parent
        return paths

    def _evict_one(self, protected: set[bytes]) -> list[Path] | None:
        """The least recently used resumable point: an inner one (or one in `protected`, the chain a
        write hangs below) loses only its end state, its stretch serving what is below it; a leaf goes
        whole, with the ancestors it leaves useless. The files to remove; None when nothing is left."""
        if not self._lru:
            return None
        key, _ = self._lru.popitem(last=False)
        entry = self._entries[key]
        self.stats.evictions += 1
        self.stats.bytes -= entry.state_size
        entry.state_size = 0
        paths = [self._path(key, STATE_SUFFIX)]
        if self._children.get(key) or key in protected:
            return paths
        return paths + self._prune(key)

    def _touch_chain(self, chain: list[Entry]) -> None:
        """Used now, as the memory tier orders an insert: from the root down, so a conversation's inner
        points lose their end states before its deepest one, and its message boundaries last of all
        (the snapshot one token before a prompt's end serves only an exact repeat)."""
        for boundary in (False, True):
            for entry in chain:
                if entry.boundary == boundary and entry.key in self._lru:
                    self._lru.move_to_end(entry.key)

    def _chain(self, key: bytes | None) -> list[Entry]:
        chain = []
        while key is not None and key in self._entries:
            chain.append(self._entries[key])
            key = self._entries[key].parent
        return chain[::-1]

    def _room(self, size: int, keep: bytes | None = None) -> list[Path]:
        """Other validities' files first, then this one's least recently used points (never `keep`
        or what is above it), until `size` more bytes fit the budget: the files to remove."""
        doomed: list[Path] = []
        while self.total_bytes + size > self.max_bytes and self._foreign:
            _, path, n = self._foreign.pop(0)
            self._foreign_bytes -= n
            self.stats.evictions += 1
            doomed.append(path)
        protected = {e.key for e in self._chain(keep)}
        if self.total_bytes + size > self.max_bytes:
            # Stretches with neither an end state nor anything below (their state's write was dropped)
            # lead nowhere: they go before any snapshot does.
            queued = {k for k, _ in self._queued}
            for key in [k for k, e in self._entries.items() if not e.resumable and not self._children.get(k)
                        and k not in protected and k not in queued]:
                doomed += self._prune(key)
        while self.total_bytes + size > self.max_bytes:
            paths = self._evict_one(protected)
            if paths is None:
                break
            doomed += paths
        return doomed

    # -- what the generation thread calls --------------------------------------------------

    @property
    def total_bytes(self) -> int:
        """Bytes counted against the budget: this validity's entries and every other's."""
        return self.stats.bytes + self._foreign_bytes

    def find(self, prompt: list[int], min_length: int = 0) -> DiskHit | None:
        """The deepest snapshot (an entry with its end state) whose tokens begin `prompt` and that
        resumes further than `min_length` (the memory tier's hit), or None."""
        if not self.enabled:
            return None
        with self._lock:
            chain, key, pos = [], None, 0
            while pos < len(prompt):
                step = None
                for n in sorted(self._lengths.get(key, {}), reverse=True):
                    if pos + n <= len(prompt) and (k := chain_key(key, prompt[pos: pos + n])) in self._entries:
                        step = self._entries[k]
                        break
                if step is None:
                    break
                chain.append(step)
                key, pos = step.key, step.end
            while chain and not chain[-1].resumable:
                chain.pop()
            if not chain or chain[-1].end <= min_length:
                return None
            self._touch_chain(chain)
            return DiskHit(chain[-1].end, chain)

    def load(self, hit: DiskHit, prompt: list[int], skip: int = 0, convert=None) -> Future:
        """Read `hit`'s chain on the tier's thread: the stretches of all but its first `skip` entries
        (which the caller holds) and the last one's end state. The future's result is a `Loaded` (passed
        through `convert` on that thread, e.g. `in_mlx`), or None when an entry was gone or bad (a bad
        one is counted, logged and removed) or `convert` failed."""
        future: Future = Future()
        self._put(0, "read", (hit, list(prompt[: hit.length]), skip, future, convert))
        return future

    def has(self, key: bytes, state: bool = False) -> bool:
        """Whether the node `key` is on disk or queued (with its end state, when `state`)."""
        with self._lock:
            entry = self._entries.get(key)
            on_disk = entry is not None and (entry.resumable or not state)
            return on_disk or (key, True) in self._queued or (not state and (key, False) in self._queued)

    def store(self, key: bytes, parent: bytes | None, start: int, tokens, segment, end_state, boundary: bool = False) -> bool:
        """Queue what the disk lacks of one node (its stretch, its end state: None for none) for writing;
        False when nothing is queued (all there already, the backlog full, the directory not writable).
        The trees hold evaluated, contiguous mlx arrays, whose buffers are written as they are."""
        if not self.enabled:
            return False
        with self._lock:
            entry = self._entries.get(key)
            need_kv = entry is None and (key, False) not in self._queued and (key, True) not in self._queued
            need_state = end_state is not None and not (entry is not None and entry.resumable) and (key, True) not in self._queued
            if entry is not None and entry.resumable:
                self._lru.move_to_end(key)
            if not need_kv and not need_state:
                return False
            if not self.writable and (not self._retry_at or time.monotonic() < self._retry_at):
                self.stats.dropped += 1
                return False
            kv = _Payload.of(segment) if need_kv else None
            state = _Payload.of(end_state) if need_state else None
            size = (kv.nbytes if kv else 0) + (state.nbytes if state else 0)
            if self._queued and self._queued_bytes + size > self.pending_bytes:
                self.stats.dropped += 1
                self._warn("backlog", "prefix cache: the disk cannot keep up with the snapshots made; some stay in memory only")
                return False
            self._queued[(key, need_state)] = size
            self._queued_bytes += size
        self._put(1, "write", (key, parent, start, tuple(int(t) for t in tokens), kv, state, boundary))
        return True

    def touch(self, keys: list[bytes]) -> None:
        with self._lock:
            self._touch_chain([self._entries[k] for k in keys if k in self._entries])

    def observe_restore(self, seconds: float) -> None:
        with self._lock:
            self.stats.restore_seconds.append(seconds)

    def drain_restores(self) -> list[float]:
        with self._lock:
            out, self.stats.restore_seconds = self.stats.restore_seconds, []
            return out

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every job queued so far is done (tests, a clean stop); False on timeout."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._put(9, "flush", done)
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Finish the queued writes (within `timeout`) and stop the thread."""
        if self._thread is None:
            return
        self.flush(timeout)
        self._put(10, "stop")
        self._thread.join(timeout)
        self._thread = None
        d = self.stats
        log.info("prefix cache: the disk tier stops: %d writes, %.1f MB in %.3f s, %.3f s of it syncing", d.writes,
                 d.written_bytes / 1e6, d.write_seconds, d.sync_seconds)

    # -- the tier's thread -------------------------------------------------------------------

    def _put(self, priority: int, kind: str, payload=None) -> None:
        self._jobs.put(_Job(priority, next(self._order), kind, payload))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job.kind != "write" and self._staged:
                self._commit_staged()  # what a read, a flush or the stop may see is on disk
            if job.kind == "stop":
                return
            try:
                if job.kind == "write":
                    self._write(*job.payload)
                    if self._staged and (self._jobs.empty() or sum(s[4] for s in self._staged) >= COMMIT_BYTES):
                        self._commit_staged()
                elif job.kind == "read":
                    self._read(*job.payload)
                elif job.kind == "flush":
                    job.payload.set()
            except Exception:  # never the thread's end: a bug here costs the tier a job, not the worker
                log.exception("prefix cache: the disk tier's %s failed", job.kind)
                self.stats.errors += 1
                if job.kind == "read" and not job.payload[3].done():
                    job.payload[3].set_result(None)

    def _write(self, key: bytes, parent: bytes | None, start: int, tokens: tuple, kv: "_Payload | None",
               state: "_Payload | None", boundary: bool) -> None:
        try:
            if not self._writable_now():
                self.stats.dropped += 1
                return
            common = {"layout": LAYOUT, "folder": self.folder.name, "key": key.hex()}
            files = []
            if kv is not None:
                files.append((KV_SUFFIX, kv.encode({**common, "parent": parent.hex() if parent else None,
                                                     "start": start, "tokens": list(tokens), "boundary": boundary})))
            if state is not None:
                files.append((STATE_SUFFIX, state.encode(common)))
            for suffix, parts in files:
                size = _size(parts)
                with self._lock:
                    if suffix == KV_SUFFIX and parent is not None and parent not in self._entries:
                        self.stats.dropped += 1  # its parent went meanwhile: it could never be restored
                        return
                    if suffix == STATE_SUFFIX and key not in self._entries:
                        self.stats.dropped += 1
                        return
                    doomed = self._room(size, keep=key if key in self._entries else parent)
                    fits = self.total_bytes + size <= self.max_bytes
                for path in doomed:
                    self._remove_file(path)
                if not fits:
                    self.stats.dropped += 1
                    return
                path = self._path(key, suffix)
                try:
                    self._staged.append((_stage(path, parts, self.stats), path, key, suffix == STATE_SUFFIX, size))
                except OSError as e:
                    self._write_failed(e)
                    return
                with self._lock:
                    if suffix == KV_SUFFIX:
                        if parent is not None and parent not in self._entries:  # evicted meanwhile: an orphan
                            self._remove_file(path)
                            return
                        self._add_kv(key, parent, start, len(tokens), size, boundary)
                    elif key in self._entries:
                        self._add_state(key, size)
                    else:
                        self._remove_file(path)
                        return
                    self._touch_chain(self._chain(key))
            self._staged_writes += 1  # counted in `writes` once its batch is in place
        finally:
            with self._lock:
                self._queued_bytes -= self._queued.pop((key, state is not None), 0)

    def _commit_staged(self) -> None:
        """Put the staged files still wanted in place as one batch (`_commit`); the others (evicted since
        they were written) are removed. A batch that fails takes its entries out of the index."""
        with self._lock:
            staged, self._staged = self._staged, []
            writes, self._staged_writes = self._staged_writes, 0
            wanted = [(tmp, path) for tmp, path, key, state, _ in staged
                      if key in self._entries and (self._entries[key].resumable or not state)]
        for tmp in {s[0] for s in staged} - {t for t, _ in wanted}:
            _unlink(tmp)
        try:
            _commit(wanted, self.stats)
            self.stats.writes += writes
        except OSError as e:
            with self._lock:
                doomed = [p for s in staged if s[2] in self._entries for p in self._drop_subtree(s[2])]
            for path in [t for t, _ in wanted] + doomed:
                self._remove_file(path)
            self._write_failed(e)

    def _writable_now(self) -> bool:
        if self.writable:
            return True
        if self._retry_at and time.monotonic() >= self._retry_at:
            self.writable, self._retry_at = True, 0.0
            return True
        return False

    def _write_failed(self, e: OSError) -> None:
        self.stats.errors += 1
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            self.writable, self._retry_at = False, time.monotonic() + RETRY_SECONDS
            self._warn("full", f"prefix cache: `{self.folder}` is full ({e.strerror}): snapshots stay in memory only; "
                               f"trying again every {RETRY_SECONDS:.0f} s\n\nhint: free space there or lower `prefixCache.diskGiB`")
        elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            self.writable, self._retry_at = False, 0.0
            self._warn("readonly", f"prefix cache: `{self.folder}` cannot be written ({e.strerror}): snapshots stay in memory only"
                                   "\n\nhint: give `prefixCache.dir` a directory the worker may write")
        else:
            self._warn(f"write:{e.errno}", f"prefix cache: a snapshot could not be written to `{self.folder}`: {e}")

    def _read(self, hit: DiskHit, prompt: list[int], skip: int, future: Future, convert) -> None:
        tokens, segments, end_state, read = [], [], None, 0
        for i, entry in enumerate(hit.chain):
            path = self._path(entry.key, KV_SUFFIX)
            try:
                header, data, n = _read_file(path, entry.key, payload=i >= skip)
                read += n
                if header["tokens"] != prompt[entry.start: entry.end]:
                    raise BadEntry("its tokens are not the ones its key stands for")
                tokens.append(tuple(header["tokens"]))
                segments.append(data)
                if i == len(hit.chain) - 1:
                    path = self._path(entry.key, STATE_SUFFIX)
                    _, end_state, n = _read_file(path, entry.key, payload=True)
                    read += n
            except FileNotFoundError:  # evicted since it was found: a plain miss
                with self._lock:
                    doomed = self._drop_subtree(entry.key) if entry.key in self._entries else []
                for path in doomed:
                    self._remove_file(path)
                future.set_result(None)
                return
            except (OSError, BadEntry, ValueError, KeyError, TypeError) as e:
                with self._lock:
                    doomed = self._drop_subtree(entry.key) if entry.key in self._entries else []
                self._bad(path, e, doomed)
                future.set_result(None)
                return
        with self._lock:
            self.stats.hits += 1
            self.stats.read_bytes += read
        for entry in hit.chain:
            try:
                os.utime(self._path(entry.key, STATE_SUFFIX if entry.resumable else KV_SUFFIX))
            except OSError:
                pass  # the recency a restart orders by; nothing lost without it
        loaded = Loaded(tokens, segments, end_state)
        future.set_result(convert(loaded) if convert is not None else loaded)

    # -- small things --------------------------------------------------------------------

    def _bad(self, path: Path, e: Exception, doomed: list[Path] = ()) -> None:
        self.stats.errors += 1
        if self._bad_logged < LOGGED_BAD_ENTRIES:
            self._bad_logged += 1
            more = "" if self._bad_logged < LOGGED_BAD_ENTRIES else " (further bad entries are counted, not logged)"
            log.warning("prefix cache: `%s` is not a valid snapshot (%s): removed, treated as a miss%s", path, e, more)
        for p in {path, *doomed}:
            self._remove_file(p)

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", message)

    def _remove_file(self, path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            return
        if path.parent != self.folder:  # another validity's: its folder goes with its last file
            try:
                path.parent.rmdir()
            except OSError:
                pass


@dataclass
class _Payload:
    """A tree's arrays as the buffers to write: its skeleton, each array's dtype and shape, their bytes."""

    skeleton: object
    views: list[memoryview]
    dtypes: list[str]
    shapes: list[list[int]]

    @classmethod
    def of(cls, tree) -> "_Payload":
        leaves: list = []
        skeleton = flatten(tree, leaves)
        return cls(skeleton, [memoryview(a) for a in leaves], [_dtype_name(a) for a in leaves], [list(a.shape) for a in leaves])

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.views)

    def encode(self, fields: dict) -> list:
        """The file's parts: `MAGIC`, the header's length and CRC, the header, the arrays."""
        arrays, offset = [], 0
        for v, dtype, shape in zip(self.views, self.dtypes, self.shapes):
            arrays.append([dtype, shape, offset, v.nbytes])
            offset += v.nbytes
        crc = 0
        for v in self.views:
            crc = zlib.crc32(v, crc)
        header = json.dumps({**fields, "skeleton": self.skeleton, "arrays": arrays, "crc": crc}, separators=(",", ":")).encode()
        return [MAGIC, _PREFIX.pack(len(header), zlib.crc32(header)), header, *self.views]


#: macOS's `fsync` leaves the data in the drive's cache; this fcntl flushes that too (None elsewhere).
_FULLFSYNC = getattr(fcntl, "F_FULLFSYNC", None)


def _sync(fd: int) -> None:
    """What `fd` holds, on the device: `F_FULLFSYNC` where the platform has it, else (or where the
    filesystem refuses it) `fsync`."""
    if _FULLFSYNC is not None:
        try:
            fcntl.fcntl(fd, _FULLFSYNC)
            return
        except OSError:
            pass
    os.fsync(fd)


def _size(parts: list) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def _stage(path: Path, parts: list, stats: DiskStats) -> Path:
    """`parts` written to a temporary name beside `path` (not synced): `_commit` puts it in place."""
    started = time.perf_counter()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
    except BaseException:
        _unlink(tmp)
        raise
    stats.write_seconds += time.perf_counter() - started
    stats.written_bytes += _size(parts)
    return tmp


def _commit(moves: list[tuple[Path, Path]], stats: DiskStats) -> None:
    """Staged files put in place through a power cut: each synced, then renamed to its name, then each
    folder synced once for all its renames (one batch's files cost one folder sync, not one each)."""
    started = time.perf_counter()
    synced = 0.0
    for tmp, _ in moves:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            t = time.perf_counter()
            _sync(fd)
            synced += time.perf_counter() - t
        finally:
            os.close(fd)
    for tmp, path in moves:
        os.replace(tmp, path)
    for folder in dict.fromkeys(path.parent for _, path in moves):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            t = time.perf_counter()
            _sync(fd)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # a filesystem that cannot sync a folder
                raise
        finally:
            synced += time.perf_counter() - t
            os.close(fd)
    stats.sync_seconds += synced
    stats.write_seconds += time.perf_counter() - started


def _durable_write(path: Path, parts: list, stats: DiskStats) -> None:
    """`parts` as the file `path`, all of it or nothing, through a power cut (a batch of one)."""
    tmp = _stage(path, parts, stats)
    try:
        _commit([(tmp, path)], stats)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _parent(header: dict) -> bytes | None:
    return bytes.fromhex(header["parent"]) if header.get("parent") else None


def _read_header(path: Path) -> tuple[dict, int]:
    """A file's header, checked (magic, CRC, layout, folder, size), and the file's size."""
    with open(path, "rb") as f:
        return _header(f, path)


def _header(f, path: Path) -> tuple[dict, int]:
    head = f.read(len(MAGIC) + _PREFIX.size)
    if len(head) < len(MAGIC) + _PREFIX.size or head[: len(MAGIC)] != MAGIC:
        raise BadEntry("not a snapshot file of this layout")
    n, crc = _PREFIX.unpack(head[len(MAGIC):])
    raw = f.read(n)
    if len(raw) != n or zlib.crc32(raw) != crc:
        raise BadEntry("its header is cut short or corrupt")
    header = json.loads(raw)
    if header.get("layout") != LAYOUT or header.get("folder") != path.parent.name:
        raise BadEntry("it was written for another model or version")
    size = os.fstat(f.fileno()).st_size
    total = len(head) + n + sum(a[3] for a in header["arrays"])
    if size != total:
        raise BadEntry(f"it is {size} bytes, its header says {total}")
    return header, size


def _read_file(path: Path, key: bytes, payload: bool) -> tuple[dict, object, int]:
    """A file's header and (`payload`) its tree of arrays, each check passed, else `BadEntry`."""
    with open(path, "rb") as f:
        header, _ = _header(f, path)
        if header["key"] != key.hex():
            raise BadEntry("its key is not its name")
        if not payload:
            return header, None, 0
        arrays = header["arrays"]
        buf = bytearray(sum(a[3] for a in arrays))
        if f.readinto(buf) != len(buf):
            raise BadEntry("it is cut short")
    if zlib.crc32(buf) != header["crc"]:
        raise BadEntry("its data does not match its checksum")
    leaves = []
    for dtype, shape, offset, nbytes in arrays:
        if dtype not in _NUMPY:
            raise BadEntry(f"an unknown dtype: {dtype}")
        kind = np.dtype(_NUMPY[dtype])
        leaves.append(RawArray(np.frombuffer(buf, dtype=kind, count=nbytes // kind.itemsize, offset=offset).reshape(shape), dtype))
    return header, unflatten(header["skeleton"], leaves), len(buf)
