"""The prefix cache's disk tier: snapshots kept on disk under a byte budget, valid across restarts.

The memory tier (`mtpstack.worker.prefix_cache`) keeps a tree of stretches; this keeps the same
stretches as files, two per node: its stretch (`<key>.kv`: its tokens and the attention and
drafter entries over them) and, while it is a resumable point, its end state (`<key>.st`). The key
chains the node's tokens to its parent's (`chain_key`), so a node stands for exactly one prefix of
tokens and a lookup walks the prompt the way the memory tree does, by keys instead of nodes.
Restoring a snapshot reads the stretches of its node and of every node above it (joined, they are
the prefix's caches) and its node's end state.

`DiskTier` composes three parts, one job each: the file format and its checks
(`prefix_disk_format`: headers, the arrays' trees, reading a file back, chain keys, validity
folders), the index and its eviction (`prefix_disk_index`), and the tier's thread with its durable
writes (`prefix_disk_writer`: staging, batched commits, the job queue).

Validity. Entries are valid only for what produced them: `facts` (the content digests of the
target and the drafter, their dtypes, quantization and kind, the mlx, mlx-lm and mtpstack
versions) and `LAYOUT`, hashed into the name of the folder they live in (`v<LAYOUT>-<hash>`, with
the facts in its `validity.json`). Another folder's entries are never read; they are the first
removed when space is needed. Nothing else in the directory is ever touched: only names this
tier makes.

Budget. Least recently used out first, as the memory tier evicts (`prefix_disk_index`).

Files. Every file is written whole or not at all, through a power cut too (`prefix_disk_writer`).
A short, torn, corrupt or foreign file (a filesystem that reorders writes can still leave one) is a
miss: counted (`errors`), logged (the first `LOGGED_BAD_ENTRIES`), removed with the entries below it.

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

import json
import logging
import os
import secrets
from concurrent.futures import Future
from pathlib import Path

from mtpstack.worker.prefix_disk_format import (KV_SUFFIX, LAYOUT, STATE_SUFFIX, BadEntry, Loaded, Payload, read_file,
                                                validity_folder)
from mtpstack.worker.prefix_disk_index import DiskHit, DiskIndex, DiskStats
from mtpstack.worker.prefix_disk_writer import PENDING_BYTES, DiskWriter, durable_write

log = logging.getLogger("mtpstack.worker")

#: Bad entries logged one by one; after that only counted.
LOGGED_BAD_ENTRIES = 10


class DiskTier:
    """Entries of one validity in `directory`, at most `max_bytes` in all (other validities' included)."""

    def __init__(self, directory: str | Path, max_bytes: int, facts: dict, *, pending_bytes: int = PENDING_BYTES):
        self.root = Path(directory)
        self.facts = dict(facts)
        self.folder = self.root / validity_folder(self.facts)
        self.pending_bytes = pending_bytes
        self.stats = DiskStats()
        #: A name for this cache that outlives the process: kept in its folder, new with the folder.
        self.cache_id: str | None = None
        self.enabled = False
        self.index = DiskIndex(self.folder, max(0, int(max_bytes)), self.stats)
        self.writer = DiskWriter(self.index, self.stats, self._read, self._warn)
        self._warned: set[str] = set()
        self._bad_logged = 0

    @property
    def writable(self) -> bool:
        return self.writer.writable

    # -- opening --------------------------------------------------------------------------

    def open(self) -> "DiskTier":
        """Read the directory's index (headers only) and start the tier's thread. Never raises: a
        directory that cannot be used is a warning and the tier stays off."""
        if self.index.max_bytes <= 0:
            return self
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.folder.mkdir(exist_ok=True)
            self.writer.writable = os.access(self.folder, os.W_OK)
        except OSError as e:
            self.writer.writable = False
            if not self.folder.is_dir():
                self._warn("open", f"prefix cache: the disk tier is off: `{self.root}` cannot be used: {e.strerror or e}"
                           "\n\nhint: give `prefixCache.dir` a directory the worker may write, or set it to null")
                return self
        try:
            doomed, bad = self.index.scan(self.root)
        except OSError as e:
            self._warn("open", f"prefix cache: the disk tier is off: `{self.folder}` cannot be read: {e.strerror or e}")
            return self
        for path, e in bad:
            self._bad(path, e)
        for path in doomed:
            self.writer.remove_file(path)
        if not self.writable:
            self._warn("readonly", f"prefix cache: `{self.folder}` is read-only: the snapshots on it are served, none are added")
        self._load_id()
        self.enabled = True
        for path in self.index.room(0):
            self.writer.remove_file(path)
        self.writer.start()
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
                    durable_write(path, [self.cache_id.encode()], self.stats)
                    durable_write(self.folder / "validity.json",
                                  [json.dumps({"layout": LAYOUT, **self.facts}, indent=1, sort_keys=True).encode()], self.stats)
                except OSError:
                    pass

    # -- what the generation thread calls --------------------------------------------------

    @property
    def total_bytes(self) -> int:
        """Bytes counted against the budget: this validity's entries and every other's."""
        return self.index.total_bytes

    def find(self, prompt: list[int], min_length: int = 0) -> DiskHit | None:
        """The deepest snapshot (an entry with its end state) whose tokens begin `prompt` and that
        resumes further than `min_length` (the memory tier's hit), or None."""
        if not self.enabled:
            return None
        with self.index.lock:
            return self.index.find(prompt, min_length)

    def load(self, hit: DiskHit, prompt: list[int], skip: int = 0, convert=None) -> Future:
        """Read `hit`'s chain on the tier's thread: the stretches of all but its first `skip` entries
        (which the caller holds) and the last one's end state. The future's result is a `Loaded` (passed
        through `convert` on that thread, e.g. `in_mlx`), or None when an entry was gone or bad (a bad
        one is counted, logged and removed) or `convert` failed."""
        future: Future = Future()
        self.writer.put(0, "read", (hit, list(prompt[: hit.length]), skip, future, convert))
        return future

    def has(self, key: bytes, state: bool = False) -> bool:
        """Whether the node `key` is on disk or queued (with its end state, when `state`)."""
        with self.index.lock:
            entry, queued = self.index.entries.get(key), self.index.queued
            on_disk = entry is not None and (entry.resumable or not state)
            return on_disk or (key, True) in queued or (not state and (key, False) in queued)

    def store(self, key: bytes, parent: bytes | None, start: int, tokens, segment, end_state, boundary: bool = False) -> bool:
        """Queue what the disk lacks of one node (its stretch, its end state: None for none) for writing;
        False when nothing is queued (all there already, the backlog full, the directory not writable).
        The trees hold evaluated, contiguous mlx arrays, whose buffers are written as they are."""
        if not self.enabled:
            return False
        index = self.index
        with index.lock:
            entry = index.entries.get(key)
            need_kv = entry is None and (key, False) not in index.queued and (key, True) not in index.queued
            need_state = end_state is not None and not (entry is not None and entry.resumable) and (key, True) not in index.queued
            if entry is not None and entry.resumable:
                index.lru.move_to_end(key)
            if not need_kv and not need_state:
                return False
            if self.writer.refuses():
                self.stats.dropped += 1
                return False
            kv = Payload.of(segment) if need_kv else None
            state = Payload.of(end_state) if need_state else None
            size = (kv.nbytes if kv else 0) + (state.nbytes if state else 0)
            if index.queued and index.queued_bytes + size > self.pending_bytes:
                self.stats.dropped += 1
                self._warn("backlog", "prefix cache: the disk cannot keep up with the snapshots made; some stay in memory only")
                return False
            index.queued[(key, need_state)] = size
            index.queued_bytes += size
        self.writer.put(1, "write", (key, parent, start, tuple(int(t) for t in tokens), kv, state, boundary))
        return True

    def touch(self, keys: list[bytes]) -> None:
        with self.index.lock:
            self.index.touch_chain([self.index.entries[k] for k in keys if k in self.index.entries])

    def observe_restore(self, seconds: float) -> None:
        with self.index.lock:
            self.stats.restore_seconds.append(seconds)

    def drain_restores(self) -> list[float]:
        with self.index.lock:
            out, self.stats.restore_seconds = self.stats.restore_seconds, []
            return out

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every job queued so far is done (tests, a clean stop); False on timeout."""
        return self.writer.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Finish the queued writes (within `timeout`) and stop the thread."""
        if not self.writer.running:
            return
        self.writer.stop(timeout)
        d = self.stats
        log.info("prefix cache: the disk tier stops: %d writes, %.1f MB in %.3f s, %.3f s of it syncing", d.writes,
                 d.written_bytes / 1e6, d.write_seconds, d.sync_seconds)

    # -- on the tier's thread -----------------------------------------------------------------

    def _read(self, hit: DiskHit, prompt: list[int], skip: int, future: Future, convert) -> None:
        tokens, segments, end_state, read = [], [], None, 0
        for i, entry in enumerate(hit.chain):
            path = self.index.path(entry.key, KV_SUFFIX)
            try:
                header, data, n = read_file(path, entry.key, payload=i >= skip)
                read += n
                if header["tokens"] != prompt[entry.start: entry.end]:
                    raise BadEntry("its tokens are not the ones its key stands for")
                tokens.append(tuple(header["tokens"]))
                segments.append(data)
                if i == len(hit.chain) - 1:
                    path = self.index.path(entry.key, STATE_SUFFIX)
                    _, end_state, n = read_file(path, entry.key, payload=True)
                    read += n
            except FileNotFoundError:  # evicted since it was found: a plain miss
                with self.index.lock:
                    doomed = self.index.drop_subtree(entry.key) if entry.key in self.index.entries else []
                for path in doomed:
                    self.writer.remove_file(path)
                future.set_result(None)
                return
            except (OSError, BadEntry, ValueError, KeyError, TypeError) as e:
                with self.index.lock:
                    doomed = self.index.drop_subtree(entry.key) if entry.key in self.index.entries else []
                self._bad(path, e, doomed)
                future.set_result(None)
                return
        with self.index.lock:
            self.stats.hits += 1
            self.stats.read_bytes += read
        for entry in hit.chain:
            try:
                os.utime(self.index.path(entry.key, STATE_SUFFIX if entry.resumable else KV_SUFFIX))
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
            self.writer.remove_file(p)

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", message)
