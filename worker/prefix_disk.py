"""The prefix cache's disk tier: snapshots kept on disk under a byte budget, valid across restarts.

The memory tier (`mtpstack.worker.prefix_cache`) keeps a tree of stretches; this keeps the same
stretches as files, one per node, named by a key that chains the node's tokens to its parent's
(`chain_key`), so a file stands for exactly one prefix of tokens and a lookup walks the prompt the
way the memory tree does, by keys instead of nodes. Restoring a snapshot reads its node and every
node above it (their stretches joined are the prefix's caches; the last one's end state is the
state there).

Validity. Entries are valid only for what produced them: `facts` (the content digests of the
target and the drafter, their dtypes and quantization, the mlx and mlx-lm versions) and
`LAYOUT`, hashed into the name of the folder they live in (`v<LAYOUT>-<hash>`, with the facts
in its `validity.json`). Another folder's entries are never read; they are the first removed
when space is needed. Nothing else in the directory is ever touched: only names this module
makes.

Format (`LAYOUT` 1). `MAGIC`, then the header's length and CRC-32 (two little-endian u32), the
header (JSON: key, parent, start, tokens, each array's dtype, shape and offset, and the CRC-32 of
the stretch's payload and of the end state's), then the stretch's arrays, then the end state's.
A reader checks everything it reads; a snapshot's inner nodes are read without their end state.
A file is written under a temporary name and renamed, so a name always holds a whole file; a
`kill -9` mid-write leaves only a temporary file, removed at the next start. A short, corrupt or
foreign file is a miss: counted (`errors`), logged once, removed with the entries below it.

Threads. The generation thread calls `find` (the index, in memory) and `store`/`load`, which
queue work for the tier's own thread and never block: writes copy nothing (the arrays' buffers,
already evaluated, are written as they are) and are dropped when the backlog passes
`pending_bytes`; a read hands back numpy arrays through a `Future`, which the generation thread
turns into mlx arrays (`to_mlx`): only that thread touches mlx. Reads go before writes.

Failures are never errors for a request: a directory that cannot be written (read-only, full, no
permission) is a warning and the worker serves from memory (a full disk is retried after
`RETRY_SECONDS`); one that cannot be read turns the tier off.
"""

from __future__ import annotations

import errno
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
SUFFIX = ".snap"
TMP_SUFFIX = ".tmp"
#: The folder of one validity: `v<LAYOUT>-` and 16 hex digits of the facts' hash.
FOLDER_PREFIX = "v"
#: Bytes of queued writes beyond which a new write is dropped (its snapshot stays in memory only).
PENDING_BYTES = 256 << 20
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
    """A tree read from disk with mlx arrays at its leaves (the generation thread's part of a restore)."""
    import mlx.core as mx

    if tree is None:
        return None
    if isinstance(tree, list):
        return [to_mlx(t) for t in tree]
    array = mx.array(tree.data)
    return array.view(getattr(mx, tree.dtype)) if tree.dtype == "bfloat16" else array


@dataclass
class Entry:
    key: bytes
    parent: bytes | None
    start: int
    length: int
    has_state: bool
    size: int
    path: Path

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class DiskHit:
    """The deepest snapshot on disk a prompt begins with: the chain of entries from the root to it."""

    length: int
    chain: list[Entry]


@dataclass
class Loaded:
    """A read chain: per entry its tokens and stretch arrays, and the last one's end state."""

    tokens: list[tuple[int, ...]]
    segments: list[object]
    end_state: object


@dataclass
class DiskStats:
    hits: int = 0
    writes: int = 0
    evictions: int = 0
    errors: int = 0
    bytes: int = 0
    entries: int = 0
    dropped: int = 0  # writes dropped: the backlog was full or the directory not writable
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
        #: A name for this cache that outlives the process: kept in the folder, new when the folder is.
        self.cache_id: str | None = None
        self.enabled = False
        self.writable = False
        self._retry_at = 0.0
        self._lock = threading.Lock()
        self._entries: dict[bytes, Entry] = {}
        self._lengths: dict[bytes | None, dict[int, int]] = {}  # parent -> child lengths -> how many
        self._children: dict[bytes | None, set[bytes]] = {}
        self._lru: OrderedDict[bytes, None] = OrderedDict()
        self._foreign: list[tuple[float, Path, int]] = []  # (mtime, path, size), oldest first
        self._foreign_bytes = 0
        self._queued: dict[bytes, int] = {}  # key -> bytes of a write not done yet
        self._queued_bytes = 0
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
            self._warn("readonly", f"prefix cache: `{self.folder}` is read-only: snapshots on it are served, none are added")
        self._load_id()
        self.enabled = True
        self._make_room(0)
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
                    self._atomic_write(path, [self.cache_id.encode()])
                    self._atomic_write(self.folder / "validity.json",
                                       [json.dumps({"layout": LAYOUT, **self.facts}, indent=1, sort_keys=True).encode()])
                except OSError:
                    pass

    def _scan(self) -> None:
        for child in self.root.iterdir():
            if child == self.folder or not child.is_dir() or not _is_folder_name(child.name):
                continue
            for f in child.iterdir():
                if f.suffix in (SUFFIX, TMP_SUFFIX) or f.name in ("id", "validity.json"):
                    try:
                        st = f.stat()
                    except OSError:
                        continue
                    self._foreign.append((st.st_mtime, f, st.st_size))
                    self._foreign_bytes += st.st_size
        self._foreign.sort(key=lambda t: t[0])
        found = []
        for f in self.folder.iterdir():
            if f.name.endswith(TMP_SUFFIX):
                self._unlink(f)  # a write that never finished (a kill -9 mid-write)
            elif f.suffix == SUFFIX:
                try:
                    entry, _ = _read_header(f)
                    if entry.key.hex() != f.stem:
                        raise BadEntry("its name is not its key")
                    found.append((f.stat().st_mtime_ns, entry))
                except (OSError, BadEntry, ValueError) as e:
                    self._bad(f, e)
        found.sort(key=lambda t: t[0])
        for _, entry in found:
            self._add(entry)
        # Entries whose parent is missing can never be restored: the chain is broken.
        orphans = [e.key for e in list(self._entries.values()) if e.parent is not None and e.parent not in self._entries]
        for key in orphans:
            for path in self._drop(key, count=False):
                self._unlink(path)

    # -- the index (under the lock) ----------------------------------------------------------

    def _add(self, entry: Entry) -> None:
        old = self._entries.get(entry.key)
        if old is not None:
            self.stats.bytes -= old.size
            self.stats.entries -= 1
        else:
            lengths = self._lengths.setdefault(entry.parent, {})
            lengths[entry.length] = lengths.get(entry.length, 0) + 1
            self._children.setdefault(entry.parent, set()).add(entry.key)
        self._entries[entry.key] = entry
        self._lru[entry.key] = None
        self._lru.move_to_end(entry.key)
        self.stats.bytes += entry.size
        self.stats.entries += 1

    def _drop(self, key: bytes, count: bool) -> list[Path]:
        """Forget `key` and every entry below it; the files to remove (by the caller, off the lock)."""
        paths = []
        stack = [key]
        while stack:
            k = stack.pop()
            entry = self._entries.pop(k, None)
            if entry is None:
                continue
            stack.extend(self._children.pop(k, ()))
            siblings = self._children.get(entry.parent)
            if siblings is not None:
                siblings.discard(k)
            lengths = self._lengths.get(entry.parent, {})
            lengths[entry.length] = lengths.get(entry.length, 1) - 1
            if lengths[entry.length] <= 0:
                lengths.pop(entry.length, None)
            self._lengths.pop(k, None)
            self._lru.pop(k, None)
            self.stats.bytes -= entry.size
            self.stats.entries -= 1
            if count:
                self.stats.evictions += 1
            paths.append(entry.path)
        return paths

    def _touch_chain(self, chain: list[Entry]) -> None:
        """Used now: the deepest first, so every entry is more recent than the ones below it (least
        recently used out first then always takes a leaf)."""
        for entry in reversed(chain):
            if entry.key in self._lru:
                self._lru.move_to_end(entry.key)

    def _chain(self, key: bytes | None) -> list[Entry]:
        chain = []
        while key is not None and key in self._entries:
            chain.append(self._entries[key])
            key = self._entries[key].parent
        return chain[::-1]

    # -- what the generation thread calls --------------------------------------------------

    @property
    def total_bytes(self) -> int:
        """Bytes counted against the budget: this validity's entries and every other's."""
        return self.stats.bytes + self._foreign_bytes

    def contains(self, key: bytes) -> bool:
        with self._lock:
            return key in self._entries or key in self._queued

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
            while chain and not chain[-1].has_state:
                chain.pop()
            if not chain or chain[-1].end <= min_length:
                return None
            self._touch_chain(chain)
            return DiskHit(chain[-1].end, chain)

    def load(self, hit: DiskHit, prompt: list[int], skip: int = 0) -> Future:
        """Read `hit`'s chain (the stretches of all but its first `skip` entries, which the caller
        holds, and the last one's end state) on the tier's thread. The future's result is a `Loaded`
        (the skipped entries as None), or None when an entry was bad (it is removed)."""
        future: Future = Future()
        self._put(0, "read", (hit, list(prompt[: hit.length]), skip, future, time.monotonic()))
        return future

    def store(self, key: bytes, parent: bytes | None, start: int, tokens, segment, end_state) -> bool:
        """Queue one node for writing; False when it is not (already there or queued, the backlog full,
        the directory not writable). `segment` and `end_state` are trees of evaluated, contiguous mlx
        arrays; their buffers are written as they are, nothing is copied."""
        if not self.enabled:
            return False
        with self._lock:
            if key in self._entries or key in self._queued:
                if key in self._entries:
                    self._lru.move_to_end(key)
                return False
            if not self.writable and (not self._retry_at or time.monotonic() < self._retry_at):
                self.stats.dropped += 1
                return False
            leaves: list = []
            skeleton = [flatten(segment, leaves), flatten(end_state, leaves)]
            stretch_leaves = len(_leaves(skeleton[0]))
            views = [memoryview(a) for a in leaves]
            size = sum(v.nbytes for v in views)
            if self._queued_bytes + size > self.pending_bytes and self._queued:
                self.stats.dropped += 1
                self._warn("backlog", "prefix cache: the disk cannot keep up with the snapshots made; "
                                      "some stay in memory only")
                return False
            self._queued[key] = size
            self._queued_bytes += size
        dtypes = [_dtype_name(a) for a in leaves]
        shapes = [list(a.shape) for a in leaves]
        self._put(1, "write", (key, parent, start, tuple(int(t) for t in tokens), skeleton, stretch_leaves, views, dtypes, shapes))
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
        """Wait until every queued job is done (tests, a clean stop); False on timeout."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._put(9, "flush", done)
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        self.flush(timeout)
        self._put(10, "stop")
        self._thread.join(timeout)
        self._thread = None

    # -- the tier's thread -------------------------------------------------------------------

    def _put(self, priority: int, kind: str, payload=None) -> None:
        self._jobs.put(_Job(priority, next(self._order), kind, payload))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job.kind == "stop":
                return
            try:
                if job.kind == "write":
                    self._write(*job.payload)
                elif job.kind == "read":
                    self._read(*job.payload)
                elif job.kind == "flush":
                    job.payload.set()
            except Exception as e:  # never the thread's end: a bug here costs the tier, not the worker
                log.exception("prefix cache: the disk tier's %s failed", job.kind)
                self.stats.errors += 1
                if job.kind == "read":
                    job.payload[3].set_result(None)

    def _write(self, key, parent, start, tokens, skeleton, stretch_leaves, views, dtypes, shapes) -> None:
        size = sum(v.nbytes for v in views)
        try:
            with self._lock:
                parent_gone = parent is not None and parent not in self._entries
            if parent_gone or not self._writable_now():
                self.stats.dropped += 1
                return
            arrays, offset = [], 0
            for v, dtype, shape in zip(views, dtypes, shapes):
                arrays.append([dtype, shape, offset, v.nbytes])
                offset += v.nbytes
            header = json.dumps({
                "layout": LAYOUT, "folder": self.folder.name, "key": key.hex(), "parent": parent.hex() if parent else None,
                "start": start, "tokens": tokens, "skeleton": skeleton, "arrays": arrays, "stretch_arrays": stretch_leaves,
                "crc": [_crc(views[:stretch_leaves]), _crc(views[stretch_leaves:])],
            }, separators=(",", ":")).encode()
            total = len(MAGIC) + _PREFIX.size + len(header) + size
            if total > self.max_bytes or not self._make_room(total, keep=parent):
                self.stats.dropped += 1
                return
            path = self.folder / (key.hex() + SUFFIX)
            try:
                self._atomic_write(path, [MAGIC, _PREFIX.pack(len(header), zlib.crc32(header)), header, *views])
            except OSError as e:
                self._write_failed(e)
                return
            entry = Entry(key, parent, start, len(tokens), skeleton[1] is not None, total, path)
            with self._lock:
                if parent is not None and parent not in self._entries:  # evicted meanwhile: an orphan
                    self._unlink(path)
                    return
                self._add(entry)
                self._touch_chain(self._chain(key))
                self.stats.writes += 1
        finally:
            with self._lock:
                self._queued_bytes -= self._queued.pop(key, 0)

    def _atomic_write(self, path: Path, parts: list) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
        try:
            with open(tmp, "wb") as f:
                for part in parts:
                    f.write(part)
            os.replace(tmp, path)
        except BaseException:
            self._unlink(tmp)
            raise

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

    def _make_room(self, size: int, keep: bytes | None = None) -> bool:
        """Remove other validities' files, then this one's least recently used entries (never `keep`
        or what is above it), until `size` more bytes fit the budget; False when they cannot."""
        doomed: list[Path] = []
        with self._lock:
            while self.total_bytes + size > self.max_bytes and self._foreign:
                _, path, n = self._foreign.pop(0)
                self._foreign_bytes -= n
                self.stats.evictions += 1
                doomed.append(path)
            protected = {e.key for e in self._chain(keep)}
            for key in list(self._lru):
                if self.total_bytes + size <= self.max_bytes:
                    break
                if key not in protected and key in self._entries:
                    doomed.extend(self._drop(key, count=True))
            fits = self.total_bytes + size <= self.max_bytes
        for path in doomed:
            self._unlink(path)
            try:
                path.parent.rmdir() if path.parent != self.folder else None
            except OSError:
                pass  # not empty yet
        return fits

    def _read(self, hit: DiskHit, prompt: list[int], skip: int, future: Future, asked: float) -> None:
        tokens, segments, end_state = [], [], None
        for i, entry in enumerate(hit.chain):
            last = i == len(hit.chain) - 1
            try:
                got_tokens, segment, state = _read_entry(entry, stretch=i >= skip, state=last)
                if list(got_tokens) != prompt[entry.start: entry.end]:
                    raise BadEntry("its tokens are not the ones its key stands for")
            except FileNotFoundError:
                with self._lock:
                    doomed = self._drop(entry.key, count=False)
                for path in doomed:
                    self._unlink(path)
                future.set_result(None)
                return
            except (OSError, BadEntry, ValueError) as e:
                with self._lock:
                    doomed = self._drop(entry.key, count=False)
                self._bad(entry.path, e)
                for path in doomed:
                    self._unlink(path)
                future.set_result(None)
                return
            tokens.append(got_tokens)
            segments.append(segment)
            end_state = state
        with self._lock:
            self.stats.hits += 1
        for entry in hit.chain:
            try:
                os.utime(entry.path)  # the recency a restart orders by
            except OSError:
                pass
        future.set_result(Loaded(tokens, segments, end_state))

    # -- small things --------------------------------------------------------------------

    def _bad(self, path: Path, e: Exception) -> None:
        self.stats.errors += 1
        if self._bad_logged < LOGGED_BAD_ENTRIES:
            self._bad_logged += 1
            more = "" if self._bad_logged < LOGGED_BAD_ENTRIES else " (further bad entries are counted, not logged)"
            log.warning("prefix cache: `%s` is not a valid snapshot (%s): removed, treated as a miss%s", path, e, more)
        self._unlink(path)

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", message)

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass


def _leaves(skeleton) -> list[int]:
    if skeleton is None:
        return []
    if isinstance(skeleton, list):
        return [i for s in skeleton for i in _leaves(s)]
    return [skeleton]


def _crc(views) -> int:
    crc = 0
    for v in views:
        crc = zlib.crc32(v, crc)
    return crc


def _read_header(path: Path) -> tuple[Entry, dict]:
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + _PREFIX.size)
        if len(head) < len(MAGIC) + _PREFIX.size or head[: len(MAGIC)] != MAGIC:
            raise BadEntry("not a snapshot file of this layout")
        n, crc = _PREFIX.unpack(head[len(MAGIC):])
        raw = f.read(n)
        size = os.fstat(f.fileno()).st_size
    if len(raw) != n or zlib.crc32(raw) != crc:
        raise BadEntry("its header is cut short or corrupt")
    header = json.loads(raw)
    if header.get("layout") != LAYOUT or header.get("folder") != path.parent.name:
        raise BadEntry("it was written for another model or version")
    payload = sum(a[3] for a in header["arrays"])
    total = len(MAGIC) + _PREFIX.size + n + payload
    if size != total:
        raise BadEntry(f"it is {size} bytes, its header says {total}")
    parent = bytes.fromhex(header["parent"]) if header["parent"] else None
    entry = Entry(bytes.fromhex(header["key"]), parent, int(header["start"]), len(header["tokens"]),
                  header["skeleton"][1] is not None, size, path)
    header["_data_offset"] = len(MAGIC) + _PREFIX.size + n
    return entry, header


def _read_entry(entry: Entry, stretch: bool, state: bool) -> tuple[tuple[int, ...], object, object]:
    """An entry's tokens, its stretch's arrays (`stretch`) and its end state's (`state`), each checked."""
    _, header = _read_header(entry.path)
    if header["key"] != entry.key.hex():
        raise BadEntry("its key changed")
    base, arrays, cut = header["_data_offset"], header["arrays"], header["stretch_arrays"]
    leaves: list = [None] * len(arrays)
    with open(entry.path, "rb") as f:
        for part, members, crc in ((stretch, range(0, cut), header["crc"][0]), (state, range(cut, len(arrays)), header["crc"][1])):
            if not part or not members:
                continue
            lo = arrays[members[0]][2]
            hi = arrays[members[-1]][2] + arrays[members[-1]][3]
            buf = bytearray(hi - lo)
            f.seek(base + lo)
            if f.readinto(buf) != len(buf):
                raise BadEntry("it is cut short")
            if zlib.crc32(buf) != crc:
                raise BadEntry("its data does not match its checksum")
            for i in members:
                dtype, shape, offset, nbytes = arrays[i]
                if dtype not in _NUMPY:
                    raise BadEntry(f"unknown dtype {dtype}")
                data = np.frombuffer(buf, dtype=_NUMPY[dtype], count=nbytes // np.dtype(_NUMPY[dtype]).itemsize,
                                     offset=offset - lo).reshape(shape)
                leaves[i] = RawArray(data, dtype)
    segment, end_state = header["skeleton"]
    return (tuple(header["tokens"]), unflatten(segment, leaves) if stretch else None,
            unflatten(end_state, leaves) if state else None)
