"""The prefix cache's disk tier on its own: what it keeps, what it refuses, and what it survives."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import mlx.core as mx
import pytest

from mtpstack.worker import prefix_disk_format, prefix_disk_writer
from mtpstack.worker.prefix_disk import DiskTier
from mtpstack.worker.prefix_disk_format import chain_key, to_mlx
from mtpstack.worker.prefix_disk_index import DiskHit

FACTS = {"target": "a" * 64, "drafter": "b" * 64, "mlx": "0.32.4", "mlx_lm": "0.32.2"}
PROMPT = list(range(100, 130))
#: Three stretches of PROMPT: [0, 8), [8, 16), [16, 29) (the last one token before its end).
CUTS = [(0, 8), (8, 16), (16, 29)]


def arrays(seed: int, n: int):
    """A stretch as the engine makes one: per layer (keys, values) or None, in float32 and bfloat16."""
    mx.random.seed(seed)
    kv = (mx.random.normal((1, 2, n, 4)), mx.random.normal((1, 2, n, 4)).astype(mx.bfloat16))
    segment = ([kv, None], [(mx.random.normal((1, 1, n, 4)).astype(mx.float16), mx.zeros((1, 1, n, 4)))])
    state = ([None, (mx.random.normal((1, 3, 8)), mx.random.normal((1, 2, 4, 4)))], mx.random.normal((1, 1, 16)))
    mx.eval(segment, state)
    return segment, state


def store_prompt(tier: DiskTier, prompt=PROMPT, cuts=CUTS, seed=0) -> list[tuple[bytes, object, object]]:
    """Store `prompt`'s stretches as a chain; their keys and arrays."""
    parent, out = None, []
    for i, (a, b) in enumerate(cuts):
        key = chain_key(parent, prompt[a:b])
        segment, state = arrays(seed + i, b - a)
        tier.store(key, parent, a, prompt[a:b], segment, state)
        out.append((key, segment, state))
        parent = key
    assert tier.flush(30)
    return out


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and bool(mx.array_equal(a, b))


def load(tier: DiskTier, prompt, min_length=0):
    hit = tier.find(prompt, min_length)
    if hit is None:
        return None, None
    return hit, hit and tier.load(hit, prompt).result(30)


def open_tier(path: Path, max_bytes=1 << 30, facts=FACTS) -> DiskTier:
    return DiskTier(path, max_bytes, facts).open()


@pytest.fixture
def tier(tmp_path):
    t = open_tier(tmp_path / "cache")
    yield t
    t.close()


def test_a_stored_chain_reads_back_bit_for_bit_and_the_deepest_snapshot_is_found(tier):
    stored = store_prompt(tier)
    hit, loaded = load(tier, PROMPT + [7, 7])
    assert hit.length == 29 and [e.key for e in hit.chain] == [k for k, _, _ in stored]
    assert loaded.tokens == [tuple(PROMPT[a:b]) for a, b in CUTS]
    for (_, segment, _), got in zip(stored, loaded.segments):
        assert same(to_mlx(got), segment)
    assert same(to_mlx(loaded.end_state), stored[-1][2])
    assert tier.find(PROMPT[:20]).length == 16  # a prompt that leaves inside the last stretch
    assert tier.find([1, 2, 3]) is None
    assert tier.stats.writes == 3 and tier.stats.hits == 1 and tier.stats.errors == 0


def test_the_caller_can_skip_the_stretches_it_holds(tier):
    store_prompt(tier)
    hit = tier.find(PROMPT)
    loaded = tier.load(hit, PROMPT, skip=2).result(30)
    assert loaded.segments[:2] == [None, None] and loaded.segments[2] is not None and loaded.end_state is not None


def test_a_read_hands_back_mlx_arrays_made_and_evaluated_on_the_tiers_thread(tier):
    import threading

    stored = store_prompt(tier)
    threads = []

    def convert(loaded):
        threads.append(threading.current_thread().name)
        return prefix_disk_format.in_mlx(loaded)

    hit = tier.find(PROMPT)
    loaded = tier.load(hit, PROMPT, skip=1, convert=convert).result(30)
    assert threads == ["prefix-disk"] and loaded.segments[0] is None
    for (_, segment, _), got in zip(stored[1:], loaded.segments[1:]):
        assert same(got, segment)  # used here, on another thread than the one that made them
    assert same(loaded.end_state, stored[-1][2])
    assert loaded.segments[1][0][0][1].dtype == mx.bfloat16
    joined = mx.concatenate([loaded.segments[1][0][0][0], loaded.segments[2][0][0][0]], axis=2)
    assert joined.shape[2] == 21 and bool(mx.array_equal(joined[:, :, :8], stored[1][1][0][0][0]))


def test_a_conversion_that_fails_is_a_miss_not_a_stuck_row(tier):
    store_prompt(tier)

    def convert(loaded):
        raise MemoryError("no room for the arrays")

    assert tier.load(tier.find(PROMPT), PROMPT, convert=convert).result(30) is None
    assert tier.stats.errors == 1 and tier.find(PROMPT).length == 29  # the entries stay: nothing was wrong with them


def test_a_restarted_tier_finds_its_entries_at_once(tmp_path):
    first = open_tier(tmp_path)
    stored = store_prompt(first)
    first.close()
    again = open_tier(tmp_path)
    assert again.cache_id == first.cache_id and again.stats.entries == 3
    hit, loaded = load(again, PROMPT)
    assert hit.length == 29 and same(to_mlx(loaded.end_state), stored[-1][2])
    again.close()


def test_a_memory_hit_as_deep_is_not_found_again_on_disk(tier):
    store_prompt(tier)
    assert tier.find(PROMPT, min_length=29) is None
    assert tier.find(PROMPT, min_length=28).length == 29


@pytest.mark.parametrize("damage", ["a flipped byte in the data", "a flipped byte in the header", "cut short"])
def test_a_damaged_entry_is_a_miss_counted_logged_once_and_removed_with_what_is_below_it(tmp_path, caplog, damage):
    tier = open_tier(tmp_path)
    stored = store_prompt(tier)
    middle = tier.folder / (stored[1][0].hex() + ".kv")  # its stretch: an inner entry's end state is not read
    data = bytearray(middle.read_bytes())
    if damage == "cut short":
        data = data[: len(data) - 5]
    else:
        data[-3 if "data" in damage else 30] ^= 0xFF
    middle.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="mtpstack.worker"):
        hit, loaded = load(tier, PROMPT)
    assert hit.length == 29 and loaded is None
    assert tier.stats.errors == 1 and sum("not a valid snapshot" in r.message for r in caplog.records) == 1
    assert not middle.exists() and not (tier.folder / (stored[2][0].hex() + ".kv")).exists()
    assert tier.find(PROMPT).length == 8  # what is above the damage still serves
    tier.close()


def test_a_damaged_entry_found_at_start_is_removed_and_the_rest_serve(tmp_path):
    tier = open_tier(tmp_path)
    stored = store_prompt(tier)
    store_prompt(tier, prompt=[5] * 30, seed=9)
    tier.close()
    leaf = tier.folder / (stored[2][0].hex() + ".kv")
    leaf.write_bytes(leaf.read_bytes()[:40])
    again = open_tier(tmp_path)
    assert again.stats.errors == 1 and not leaf.exists()
    assert not (tier.folder / (stored[2][0].hex() + ".st")).exists()  # its end state went with it
    assert again.find(PROMPT).length == 16 and again.find([5] * 30).length == 29
    again.close()


def test_another_models_entries_are_never_read_and_go_first_when_space_is_needed(tmp_path):
    theirs = open_tier(tmp_path)
    store_prompt(theirs)
    theirs.close()
    their_files = sorted(theirs.folder.iterdir())
    size = sum(f.stat().st_size for f in their_files)
    budget = int(size * 1.6)
    ours = open_tier(tmp_path, max_bytes=budget, facts={**FACTS, "target": "c" * 64})
    assert ours.find(PROMPT) is None and ours.cache_id != theirs.cache_id
    assert all(f.exists() for f in their_files)  # room enough: left alone
    store_prompt(ours)
    assert not all(f.exists() for f in their_files)  # room was needed: theirs went, none of ours
    assert ours.stats.entries == 3 and ours.find(PROMPT).length == 29
    assert sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()) <= budget
    store_prompt(ours, prompt=[3] * 30)
    assert not theirs.folder.exists()  # all of theirs before any of ours
    ours.close()


def test_a_newer_layout_or_version_is_another_validity():
    assert prefix_disk_format.validity_folder(FACTS) != prefix_disk_format.validity_folder({**FACTS, "mlx": "0.33.0"})
    assert prefix_disk_format.validity_folder(FACTS).startswith(f"v{prefix_disk_format.LAYOUT}-")


def test_a_flood_stays_within_the_disk_budget_and_the_newest_stay(tmp_path):
    probe = open_tier(tmp_path / "probe")
    store_prompt(probe)
    one = probe.total_bytes
    probe.close()
    budget = int(one * 3.5)
    tier = open_tier(tmp_path / "cache", max_bytes=budget)
    for i in range(12):
        prompt = [i] + PROMPT[1:]
        store_prompt(tier, prompt=prompt, seed=i)
        on_disk = sum(f.stat().st_size for f in tier.folder.glob("*.kv")) + sum(f.stat().st_size for f in tier.folder.glob("*.st"))
        assert on_disk == tier.stats.bytes <= budget
    assert tier.stats.evictions > 0
    assert tier.find([11] + PROMPT[1:]).length == 29 and tier.find([10] + PROMPT[1:]).length == 29
    assert tier.find([0] + PROMPT[1:]) is None
    tier.close()


def test_a_used_entry_outlives_newer_unused_ones(tmp_path):
    probe = open_tier(tmp_path / "probe")
    store_prompt(probe)
    one = probe.total_bytes
    probe.close()
    tier = open_tier(tmp_path / "cache", max_bytes=int(one * 2.5))
    store_prompt(tier, prompt=[0] + PROMPT[1:])
    store_prompt(tier, prompt=[1] + PROMPT[1:])
    assert tier.find([0] + PROMPT[1:]).length == 29  # used: now the most recent
    store_prompt(tier, prompt=[2] + PROMPT[1:])
    assert tier.find([0] + PROMPT[1:]).length == 29
    assert (tier.find([1] + PROMPT[1:]) or DiskHit(0, [])).length < 29  # its snapshot at the end went
    tier.close()


def test_files_the_tier_did_not_make_are_never_touched(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "vacation").mkdir()
    (tmp_path / "vacation" / "a.snap").write_text("not a snapshot")
    tier = open_tier(tmp_path, max_bytes=1)  # a budget nothing fits
    store_prompt(tier)
    tier.close()
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "vacation" / "a.snap").exists()


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_a_directory_that_cannot_be_written_is_a_warning_and_memory_only(tmp_path, monkeypatch, caplog, code):
    tier = open_tier(tmp_path)
    store_prompt(tier, prompt=[9] * 30)

    def refuse(path, parts, stats):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(prefix_disk_writer, "stage", refuse)
    with caplog.at_level(logging.WARNING, logger="mtpstack.worker"):
        store_prompt(tier)  # no exception: the first write fails, the others are dropped
        store_prompt(tier, prompt=[8] * 30)
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "memory only" in warnings[0]
    assert tier.stats.errors == 1 and tier.stats.dropped >= 5 and not tier.writable
    assert tier.find(PROMPT) is None
    hit, loaded = load(tier, [9] * 30)  # what is there still serves
    assert loaded is not None
    tier.close()


def test_a_full_disk_is_tried_again_later(tmp_path, monkeypatch):
    tier = open_tier(tmp_path)
    real = prefix_disk_writer.stage
    monkeypatch.setattr(prefix_disk_writer, "stage", lambda path, parts, stats: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    store_prompt(tier)
    assert not tier.writable and tier.stats.writes == 0
    monkeypatch.setattr(prefix_disk_writer, "stage", real)
    monkeypatch.setattr(prefix_disk_writer.time, "monotonic", lambda: tier.writer.retry_at + 1)
    store_prompt(tier)
    assert tier.writable and tier.stats.writes == 3
    tier.close()


def test_a_directory_that_cannot_be_made_turns_the_tier_off_without_an_error(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING, logger="mtpstack.worker"):
        tier = open_tier(blocker / "cache")
    assert not tier.enabled and "disk tier is off" in caplog.text
    assert tier.store(b"k" * 16, None, 0, [1], [], None) is False and tier.find([1]) is None


def test_a_full_backlog_drops_writes_instead_of_waiting(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, 1 << 30, FACTS, pending_bytes=1)
    tier.open()
    monkeypatch.setattr(tier.writer, "put", lambda *a, **k: None)  # the thread never gets to them
    segment, state = arrays(0, 8)
    assert tier.store(chain_key(None, PROMPT[:8]), None, 0, PROMPT[:8], segment, state) is True
    assert tier.store(chain_key(None, PROMPT[:9]), None, 0, PROMPT[:9], segment, state) is False
    assert tier.stats.dropped == 1


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    import mlx.core as mx
    from mtpstack.worker import prefix_disk_writer
    from mtpstack.worker.prefix_disk import DiskTier
    from mtpstack.worker.prefix_disk_format import TMP_SUFFIX, chain_key
    from tests.worker.test_prefix_disk import FACTS, PROMPT, store_prompt

    tier = DiskTier(sys.argv[1], 1 << 30, FACTS).open()
    store_prompt(tier)  # three whole entries first
    def slow(path, parts, stats):
        def stall(tmp):
            with open(tmp, "wb") as f:
                f.write(parts[0]); f.flush()
                print("writing", flush=True)
                time.sleep(600)
        tmp = path.with_name("." + path.name + ".1.x" + TMP_SUFFIX)
        stall(tmp)

    prefix_disk_writer.stage = slow
    big = mx.zeros((64, 1024, 1024))
    mx.eval(big)
    tier.store(chain_key(None, [1, 2, 3]), None, 0, [1, 2, 3], [big], [big])
    time.sleep(600)
""")


def test_a_kill_9_mid_write_leaves_a_directory_the_next_start_uses(tmp_path):
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert any(f.name.endswith(".tmp") for f in folder.iterdir())  # killed mid-write
    tier = open_tier(tmp_path)
    assert not any(f.name.endswith(".tmp") for f in folder.iterdir())
    assert tier.stats.errors == 0 and tier.stats.entries == 3
    hit, loaded = load(tier, PROMPT)
    assert hit.length == 29 and loaded is not None
    tier.close()


def test_on_disk_inner_snapshots_lose_their_state_before_the_deepest_and_a_boundary_outlives_the_last_token(tmp_path):
    probe = open_tier(tmp_path / "probe")
    stored = store_prompt(probe)
    states = [probe.index.entries[k].state_size for k, _, _ in stored]
    total = probe.total_bytes
    probe.close()
    tier = open_tier(tmp_path / "cache", max_bytes=total - 16)  # a little less than all of it
    parent = None
    for i, (a, b) in enumerate(CUTS):  # the middle one ends where the conversation's messages end
        key = chain_key(parent, PROMPT[a:b])
        tier.store(key, parent, a, PROMPT[a:b], *arrays(i, b - a), boundary=i == 1)
        parent = key
    assert tier.flush(30)
    assert tier.total_bytes <= total - 16 and tier.stats.evictions == 1
    assert tier.find(PROMPT[:12]) is None  # the first point's state went first: its stretch stays
    assert tier.find(PROMPT).length == 29
    tier.index.max_bytes = tier.total_bytes - 1  # one more: the snapshot one token before the end goes, the boundary stays
    for path in tier.index.room(0):
        tier.writer.remove_file(path)
    assert tier.find(PROMPT).length == 16 and tier.stats.entries == 2
    assert sorted(states)[0] > 0
    tier.close()
