"""The disk tier through a power cut: what reaches the device and in which order, and that whatever
a cut leaves of a file (cut short at any byte, torn into zeros, another build's, a failed checksum)
is a miss that is removed, never a wrong answer or a crash."""

from __future__ import annotations

import errno
import json
import os
import struct
import threading
import zlib
from pathlib import Path

import pytest

from mtpstack.worker import prefix_disk_format, prefix_disk_writer
from mtpstack.worker.prefix_disk import DiskTier
from mtpstack.worker.prefix_disk_format import chain_key, to_mlx
from tests.worker.test_prefix_disk import FACTS, arrays, same

TOKENS = [41, 42, 43]


def one_snapshot(root: Path) -> tuple[dict[str, bytes], object]:
    """A small snapshot written by a real tier: each of its files' bytes, and its end state."""
    tier = DiskTier(root, 1 << 30, FACTS).open()
    segment, state = arrays(3, len(TOKENS))
    tier.store(chain_key(None, TOKENS), None, 0, TOKENS, segment, state)
    assert tier.flush(30)
    tier.close()
    files = {f.suffix: f.read_bytes() for f in tier.folder.iterdir() if f.suffix in (prefix_disk_format.KV_SUFFIX, prefix_disk_format.STATE_SUFFIX)}
    assert set(files) == {".kv", ".st"}
    return files, state


def lay_out(folder: Path, files: dict[str, bytes], damaged: str, data: bytes) -> Path:
    key = chain_key(None, TOKENS).hex()
    for suffix, whole in files.items():
        (folder / (key + suffix)).write_bytes(data if suffix == damaged else whole)
    return folder / (key + damaged)


def cut(whole: bytes, offset: int) -> bytes:
    return whole[:offset]


def torn(whole: bytes, offset: int) -> bytes:
    """The file's size was written, its bytes from `offset` on were not (a filesystem that orders metadata first)."""
    return whole[:offset] + bytes(len(whole) - offset)


@pytest.mark.parametrize("damage", [cut, torn])
@pytest.mark.parametrize("suffix", [".kv", ".st"])
def test_a_file_cut_or_torn_at_any_byte_is_a_miss_removed_at_start_or_at_the_read(tmp_path, suffix, damage):
    files, state = one_snapshot(tmp_path / "cache")
    folder = next((tmp_path / "cache").iterdir())
    whole = files[suffix]
    outcomes = set()
    for offset in range(len(whole)):
        data = damage(whole, offset)
        if data == whole:  # zeros torn over zeros: nothing lost
            continue
        path = lay_out(folder, files, suffix, data)
        tier = DiskTier(tmp_path / "cache", 1 << 30, FACTS).open()
        try:
            hit = tier.find(TOKENS + [1])
            if hit is not None:  # the header was whole: the read finds the damage
                outcomes.add("read")
                assert tier.load(hit, TOKENS + [1]).result(30) is None, offset
            else:
                outcomes.add("start")
            assert not path.exists(), offset
            assert tier.stats.errors == 1 and tier.find(TOKENS + [1]) is None, offset
        finally:
            tier.close()
    assert outcomes == {"start", "read"} if damage is torn else {"start"}
    lay_out(folder, files, suffix, whole)  # and whole again, it serves
    tier = DiskTier(tmp_path / "cache", 1 << 30, FACTS).open()
    loaded = tier.load(tier.find(TOKENS + [1]), TOKENS + [1]).result(30)
    assert same(to_mlx(loaded.end_state), state)
    tier.close()


def test_a_file_cut_after_the_index_read_it_is_a_miss_at_every_byte(tmp_path):
    files, _ = one_snapshot(tmp_path / "cache")
    folder = next((tmp_path / "cache").iterdir())
    for suffix in (".kv", ".st"):
        for offset in range(len(files[suffix])):
            lay_out(folder, files, suffix, files[suffix])
            tier = DiskTier(tmp_path / "cache", 1 << 30, FACTS).open()
            hit = tier.find(TOKENS)
            path = lay_out(folder, files, suffix, files[suffix][:offset])  # cut while the worker runs
            assert tier.load(hit, TOKENS).result(30) is None, (suffix, offset)
            assert not path.exists() and tier.stats.errors == 1 and tier.find(TOKENS) is None
            tier.close()


def rewritten(whole: bytes, change) -> bytes:
    """`whole` with its header changed by `change` and its header CRC made to match again."""
    magic = len(prefix_disk_format.MAGIC)
    n, _ = struct.unpack("<II", whole[magic: magic + 8])
    header = json.loads(whole[magic + 8: magic + 8 + n])
    change(header)
    raw = json.dumps(header, separators=(",", ":")).encode()
    return whole[:magic] + struct.pack("<II", len(raw), zlib.crc32(raw)) + raw + whole[magic + 8 + n:]


@pytest.mark.parametrize("kind", ["another magic", "another layout", "another folder's", "an unknown dtype", "a failed checksum"])
def test_another_builds_file_or_a_failed_checksum_is_a_miss_and_removed(tmp_path, kind):
    files, _ = one_snapshot(tmp_path / "cache")
    folder = next((tmp_path / "cache").iterdir())
    whole = files[".st"]
    data = {
        "another magic": lambda: b"MTPSNAP\x02" + whole[len(prefix_disk_format.MAGIC):],
        "another layout": lambda: rewritten(whole, lambda h: h.update(layout=prefix_disk_format.LAYOUT + 1)),
        "another folder's": lambda: rewritten(whole, lambda h: h.update(folder="v1-0123456789abcdef")),
        "an unknown dtype": lambda: rewritten(whole, lambda h: h["arrays"][0].__setitem__(0, "float8")),
        "a failed checksum": lambda: whole[:-1] + bytes([whole[-1] ^ 1]),
    }[kind]()
    path = lay_out(folder, files, ".st", data)
    tier = DiskTier(tmp_path / "cache", 1 << 30, FACTS).open()
    hit = tier.find(TOKENS)
    if hit is not None:  # the header passed: the read refuses it
        assert tier.load(hit, TOKENS).result(30) is None
    assert not path.exists() and tier.stats.errors == 1 and tier.find(TOKENS) is None
    tier.close()


def recorded(monkeypatch) -> list:
    """Each fsync (of what path) and rename the tier makes, in order."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a, b):
        events.append(("rename", str(a), str(b)))
        real_replace(a, b)

    monkeypatch.setattr(prefix_disk_writer.os, "fsync", fsync)
    monkeypatch.setattr(prefix_disk_writer.os, "replace", replace)
    return events


def test_each_file_is_synced_before_its_rename_and_the_renames_synced_in_their_folder(tmp_path, monkeypatch):
    events = recorded(monkeypatch)
    one_snapshot(tmp_path / "cache")
    folder = str(next((tmp_path / "cache").iterdir()))
    renames = [e for e in events if e[0] == "rename"]
    assert [Path(e[2]).name.split(".")[-1] for e in renames] == ["id", "json", "kv", "st"]
    for _, tmp, final in renames:
        at = events.index(("rename", tmp, final))
        assert ("sync", tmp) in events[:at], tmp  # the data first
        after = next(e for e in events[at:] if e[0] != "rename")
        assert after == ("sync", folder), final  # then the name, before anything else is written
    # The node's two files are one batch: both synced, both renamed, one folder sync.
    node = events[next(i for i, e in enumerate(events) if e[0] == "sync" and ".kv." in e[1]):]
    assert [e[0] for e in node] == ["sync", "sync", "rename", "rename", "sync"], node


def test_snapshots_queued_together_are_one_batch_with_one_folder_sync(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, 1 << 30, FACTS).open()
    events = recorded(monkeypatch)

    class Gate:  # a job that holds the tier's thread until the three nodes are queued, as one prefill queues them
        go = threading.Event()

        def set(self):
            self.go.wait(30)

    tier.writer.put(0, "flush", Gate())
    parent = None
    for i in range(3):
        key = chain_key(parent, [i, i + 1])
        segment, state = arrays(i, 2)
        tier.store(key, parent, 2 * i, [i, i + 1], segment, state)
        parent = key
    Gate.go.set()
    assert tier.flush(30)
    folder = str(tier.folder)
    assert sum(e[0] == "rename" for e in events) == 6 and events.count(("sync", folder)) == 1, events
    assert tier.find([0, 1, 1, 2, 2, 3, 9]).length == 6
    tier.close()


def test_a_snapshot_read_while_its_batch_is_open_is_put_in_place_first(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, 1 << 30, FACTS).open()
    segment, state = arrays(0, 3)
    real = prefix_disk_writer.commit
    commits = []
    monkeypatch.setattr(prefix_disk_writer, "commit", lambda moves, stats: (commits.append(len(moves)), real(moves, stats)))
    tier.store(chain_key(None, TOKENS), None, 0, TOKENS, segment, state)
    while (hit := tier.find(TOKENS + [1])) is None:  # in the index as soon as its files are written
        pass
    loaded = tier.load(hit, TOKENS + [1]).result(30)
    assert loaded is not None and same(to_mlx(loaded.end_state), state) and commits and tier.stats.errors == 0
    tier.close()


def test_a_batch_that_cannot_be_put_in_place_leaves_nothing_indexed_or_behind(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, 1 << 30, FACTS).open()
    monkeypatch.setattr(prefix_disk_writer, "commit", lambda moves, stats: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    segment, state = arrays(0, 3)
    tier.store(chain_key(None, TOKENS), None, 0, TOKENS, segment, state)
    assert tier.flush(30)
    assert tier.find(TOKENS + [1]) is None and tier.stats.entries == 0 and tier.stats.errors == 1
    assert sorted(f.name for f in tier.folder.iterdir()) == ["id", "validity.json"]
    tier.close()


def test_the_seconds_writing_and_syncing_are_counted(tmp_path):
    tier = DiskTier(tmp_path, 1 << 30, FACTS).open()
    segment, state = arrays(0, 4)
    tier.store(chain_key(None, [1, 2, 3, 4]), None, 0, [1, 2, 3, 4], segment, state)
    assert tier.flush(30)
    assert 0 < tier.stats.sync_seconds <= tier.stats.write_seconds
    tier.close()


def test_full_fsync_is_used_where_the_platform_has_it_and_fsync_where_the_filesystem_refuses_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(prefix_disk_writer, "_FULLFSYNC", 51)

    def fcntl(fd, op):
        calls.append(("fcntl", op))
        if refuse:
            raise OSError(errno.ENOTSUP, "not here")

    monkeypatch.setattr(prefix_disk_writer.fcntl, "fcntl", fcntl)
    monkeypatch.setattr(prefix_disk_writer.os, "fsync", lambda fd: calls.append(("fsync", None)))
    with open(tmp_path / "f", "wb") as f:
        refuse = False
        prefix_disk_writer.sync(f.fileno())
        assert calls == [("fcntl", 51)]
        refuse = True
        prefix_disk_writer.sync(f.fileno())
        assert calls[1:] == [("fcntl", 51), ("fsync", None)]
