"""The disk tier's thread and its durable writes (`mtpstack.worker.prefix_disk` composes the tier).

Every file (the entries, the folder's `id` and `validity.json`) is written under a temporary name,
synced (`fsync`; on macOS `F_FULLFSYNC`, which also empties the drive's cache), renamed and the
renames synced in their folder, so a name holds a whole file through a power cut too. The tier's
thread writes the files of the snapshots queued together, then syncs and renames them as one batch
(`commit`: one folder sync for all, before any read and at most `COMMIT_BYTES` apart); the index
counts them as soon as they are written. A `kill -9` or power cut mid-batch leaves only temporary
files, removed at the next start.

Its job queue runs reads before writes; a write that fails for a full disk stops the writes for
`RETRY_SECONDS`, one refused for a read-only directory or a permission stops them for good.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtpstack.worker.prefix_disk_format import KV_SUFFIX, LAYOUT, STATE_SUFFIX, TMP_SUFFIX, Payload
from mtpstack.worker.prefix_disk_index import DiskIndex, DiskStats

log = logging.getLogger("mtpstack.worker")

#: Bytes of queued writes beyond which a new write is dropped (its snapshot stays in memory only).
PENDING_BYTES = 256 << 20
#: Bytes of written files the tier's thread syncs and renames at the latest as one batch.
COMMIT_BYTES = 64 << 20
#: A full disk is tried again after this long.
RETRY_SECONDS = 60.0


@dataclass(order=True)
class Job:
    priority: int
    order: int
    kind: str = field(compare=False)
    payload: object = field(compare=False, default=None)


class DiskWriter:
    """The tier's thread and its queue of jobs: writes (staged, then committed in batches), reads
    (done by `read`, the tier's, ahead of writes), flushes and the stop; and whether the directory
    takes writes now (`writable`, tried again at `retry_at` after a full disk)."""

    def __init__(self, index: DiskIndex, stats: DiskStats, read: Callable, warn: Callable[[str, str], None]):
        self.index, self.folder, self.stats = index, index.folder, stats
        self._read, self._warn = read, warn
        self.writable = False
        self.retry_at = 0.0
        #: Files written under their temporary names since the last commit: (temporary, final, key, state or not, bytes).
        self._staged: list[tuple[Path, Path, bytes, bool, int]] = []
        self._staged_writes = 0
        self._jobs: queue.PriorityQueue[Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="prefix-disk", daemon=True)
        self._thread.start()

    def put(self, priority: int, kind: str, payload=None) -> None:
        self._jobs.put(Job(priority, next(self._order), kind, payload))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every job queued so far is done; False on timeout."""
        if self._thread is None:
            return True
        done = threading.Event()
        self.put(9, "flush", done)
        return done.wait(timeout)

    def stop(self, timeout: float) -> None:
        """Finish the queued jobs (within `timeout`) and stop the thread."""
        self.flush(timeout)
        self.put(10, "stop")
        self._thread.join(timeout)
        self._thread = None

    def refuses(self) -> bool:
        """Whether a write would be refused now: the directory is not writable and not due a retry."""
        return not self.writable and (not self.retry_at or time.monotonic() < self.retry_at)

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

    def _write(self, key: bytes, parent: bytes | None, start: int, tokens: tuple, kv: Payload | None,
               state: Payload | None, boundary: bool) -> None:
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
                if not self._write_file(key, parent, start, len(tokens), boundary, suffix, parts):
                    return
            self._staged_writes += 1  # counted in `writes` once its batch is in place
        finally:
            with self.index.lock:
                self.index.queued_bytes -= self.index.queued.pop((key, state is not None), 0)

    def _write_file(self, key: bytes, parent: bytes | None, start: int, length: int, boundary: bool, suffix: str,
                    parts: list) -> bool:
        """One of a node's files staged and indexed, room made for it first; False when it was not."""
        index, size = self.index, nbytes_of(parts)
        with index.lock:
            if suffix == KV_SUFFIX and parent is not None and parent not in index.entries:
                self.stats.dropped += 1  # its parent went meanwhile: it could never be restored
                return False
            if suffix == STATE_SUFFIX and key not in index.entries:
                self.stats.dropped += 1
                return False
            doomed = index.room(size, keep=key if key in index.entries else parent)
            fits = index.total_bytes + size <= index.max_bytes
        for path in doomed:
            self.remove_file(path)
        if not fits:
            self.stats.dropped += 1
            return False
        path = index.path(key, suffix)
        try:
            self._staged.append((stage(path, parts, self.stats), path, key, suffix == STATE_SUFFIX, size))
        except OSError as e:
            self._write_failed(e)
            return False
        with index.lock:
            if suffix == KV_SUFFIX:
                if parent is not None and parent not in index.entries:  # evicted meanwhile: an orphan
                    self.remove_file(path)
                    return False
                index.add_kv(key, parent, start, length, size, boundary)
            elif key in index.entries:
                index.add_state(key, size)
            else:
                self.remove_file(path)
                return False
            index.touch_chain(index.chain(key))
        return True

    def _commit_staged(self) -> None:
        """Put the staged files still wanted in place as one batch (`commit`); the others (evicted since
        they were written) are removed. A batch that fails takes its entries out of the index."""
        index = self.index
        with index.lock:
            staged, self._staged = self._staged, []
            writes, self._staged_writes = self._staged_writes, 0
            wanted = [(tmp, path) for tmp, path, key, state, _ in staged
                      if key in index.entries and (index.entries[key].resumable or not state)]
        for tmp in {s[0] for s in staged} - {t for t, _ in wanted}:
            unlink(tmp)
        try:
            commit(wanted, self.stats)
            self.stats.writes += writes
        except OSError as e:
            with index.lock:
                doomed = [p for s in staged if s[2] in index.entries for p in index.drop_subtree(s[2])]
            for path in [t for t, _ in wanted] + doomed:
                self.remove_file(path)
            self._write_failed(e)

    def _writable_now(self) -> bool:
        if self.writable:
            return True
        if self.retry_at and time.monotonic() >= self.retry_at:
            self.writable, self.retry_at = True, 0.0
            return True
        return False

    def _write_failed(self, e: OSError) -> None:
        self.stats.errors += 1
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            self.writable, self.retry_at = False, time.monotonic() + RETRY_SECONDS
            self._warn("full", f"prefix cache: `{self.folder}` is full ({e.strerror}): snapshots stay in memory only; "
                               f"trying again every {RETRY_SECONDS:.0f} s\n\nhint: free space there or lower `prefixCache.diskGiB`")
        elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            self.writable, self.retry_at = False, 0.0
            self._warn("readonly", f"prefix cache: `{self.folder}` cannot be written ({e.strerror}): snapshots stay in memory only"
                                   "\n\nhint: give `prefixCache.dir` a directory the worker may write")
        else:
            self._warn(f"write:{e.errno}", f"prefix cache: a snapshot could not be written to `{self.folder}`: {e}")

    def remove_file(self, path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            return
        if path.parent != self.folder:  # another validity's: its folder goes with its last file
            try:
                path.parent.rmdir()
            except OSError:
                pass


#: macOS's `fsync` leaves the data in the drive's cache; this fcntl flushes that too (None elsewhere).
_FULLFSYNC = getattr(fcntl, "F_FULLFSYNC", None)


def sync(fd: int) -> None:
    """What `fd` holds, on the device: `F_FULLFSYNC` where the platform has it, else (or where the
    filesystem refuses it) `fsync`."""
    if _FULLFSYNC is not None:
        try:
            fcntl.fcntl(fd, _FULLFSYNC)
            return
        except OSError:
            pass
    os.fsync(fd)


def nbytes_of(parts: list) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def stage(path: Path, parts: list, stats: DiskStats) -> Path:
    """`parts` written to a temporary name beside `path` (not synced): `commit` puts it in place."""
    started = time.perf_counter()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
    except BaseException:
        unlink(tmp)
        raise
    stats.write_seconds += time.perf_counter() - started
    stats.written_bytes += nbytes_of(parts)
    return tmp


def commit(moves: list[tuple[Path, Path]], stats: DiskStats) -> None:
    """Staged files put in place through a power cut: each synced, then renamed to its name, then each
    folder synced once for all its renames (one batch's files cost one folder sync, not one each)."""
    started = time.perf_counter()
    synced = 0.0
    for tmp, _ in moves:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            t = time.perf_counter()
            sync(fd)
            synced += time.perf_counter() - t
        finally:
            os.close(fd)
    for tmp, path in moves:
        os.replace(tmp, path)
    for folder in dict.fromkeys(path.parent for _, path in moves):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            t = time.perf_counter()
            sync(fd)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # a filesystem that cannot sync a folder
                raise
        finally:
            synced += time.perf_counter() - t
            os.close(fd)
    stats.sync_seconds += synced
    stats.write_seconds += time.perf_counter() - started


def durable_write(path: Path, parts: list, stats: DiskStats) -> None:
    """`parts` as the file `path`, all of it or nothing, through a power cut (a batch of one)."""
    tmp = stage(path, parts, stats)
    try:
        commit([(tmp, path)], stats)
    except BaseException:
        unlink(tmp)
        raise


def unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass

