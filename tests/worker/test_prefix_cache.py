"""The prefix cache in the engine: a hit is invisible in the output, the budget holds, nothing half-made is reused."""

from __future__ import annotations

import mlx.core as mx
import pytest

import mtpstack.worker.sequence as sequence_module
from mtpstack.worker.loading import Engine
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams
from mtpstack.worker.prefix_cache import PrefixCache, Stretch
from tests.worker.greedy import plain_greedy

MAX_TOKENS = 24
#: Small chunks, so the short prompts a tiny model prefills quickly still cross several snapshot points.
CHUNK = 8
SYSTEM = "You are a careful assistant. Answer briefly and exactly.\nTools: read_file, write_file, run.\n"
TURN_1 = SYSTEM + "user: list the files\nassistant:"
TURN_2 = TURN_1 + " a.py b.py\nuser: open a.py\nassistant:"
OTHER = SYSTEM + "user: what is 2 + 2?\nassistant:"
PROMPTS = [TURN_1, TURN_2, OTHER]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(sequence_module, "PREFILL_CHUNK", CHUNK)


@pytest.fixture(scope="module", params=["head", "model"])
def engine(request, hybrid_pair, tiny_pair) -> Engine:
    """A hybrid target with its MTP head, and a plain-attention target with a separate draft model."""
    target, drafter = hybrid_pair if request.param == "head" else tiny_pair
    return Engine.load(str(target), str(drafter), draft_depth=4)


@pytest.fixture(scope="module")
def reference(engine) -> dict[str, list[int]]:
    return plain_greedy(engine, MAX_TOKENS, PROMPTS)


def params(depth: int, **kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": MAX_TOKENS, "depth": depth, "ignore_eos": True, **kw})


def run(sched: Scheduler, engine: Engine, prompts: list[str], depth: int = 3, steps_before: dict | None = None):
    """Every prompt as a row of `sched` at once; returns the sequences once all are done."""
    seqs = [engine.new_sequence(engine.text_prompt(p), params(depth)) for p in prompts]
    for seq in seqs:
        sched.add(seq)
    while sched.active:
        sched.step()
    return seqs


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 4])
def test_a_hit_gives_the_targets_own_greedy_text_at_every_depth(engine, reference, depth):
    cache = PrefixCache(64 << 20)
    sched = Scheduler(1, prefix_cache=cache)
    (first,) = run(sched, engine, [TURN_1], depth)
    (second,) = run(sched, engine, [TURN_2], depth)
    (again,) = run(sched, engine, [TURN_2], depth)
    assert first.cached_tokens == 0
    # the first turn's prompt but its last token (see `Sequence._points`); a repeated prompt prefills one token
    assert second.cached_tokens == len(engine.text_prompt(TURN_1)) - 1
    assert again.cached_tokens == len(engine.text_prompt(TURN_2)) - 1
    assert first.tokens == reference[TURN_1]
    assert second.tokens == again.tokens == reference[TURN_2]
    if depth:
        assert 0 < second.accepted <= second.drafted


def test_a_conversation_that_shares_only_the_system_prompt_resumes_at_the_last_snapshot_inside_it(engine, reference):
    cache = PrefixCache(64 << 20)
    sched = Scheduler(1, prefix_cache=cache)
    run(sched, engine, [TURN_1])
    (other,) = run(sched, engine, [OTHER])
    a, b = engine.text_prompt(TURN_1), engine.text_prompt(OTHER)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert other.cached_tokens == shared // CHUNK * CHUNK > 0
    assert other.tokens == reference[OTHER]


@pytest.mark.parametrize("width", [2, 3])
def test_hits_on_one_prefix_by_rows_of_one_batch_each_give_their_own_text(engine, reference, width):
    cache = PrefixCache(64 << 20)
    sched = Scheduler(width, prefix_cache=cache)
    run(sched, engine, [TURN_1])
    seqs = run(sched, engine, [TURN_2, OTHER, TURN_1][:width], depth=2)
    assert all(seq.cached_tokens > 0 for seq in seqs)
    assert [seq.tokens for seq in seqs] == [reference[p] for p in [TURN_2, OTHER, TURN_1][:width]]


def test_a_row_joining_a_decoding_batch_from_a_hit_leaves_the_other_rows_text_alone(engine, reference):
    cache = PrefixCache(64 << 20)
    sched = Scheduler(2, prefix_cache=cache)
    run(sched, engine, [TURN_1])
    a = engine.new_sequence(engine.text_prompt(OTHER), params(3))
    sched.add(a)
    for _ in range(6):
        sched.step()
    b = engine.new_sequence(engine.text_prompt(TURN_2), params(3))
    sched.add(b)
    while sched.active:
        sched.step()
    assert b.cached_tokens > 0
    assert a.tokens == reference[OTHER] and b.tokens == reference[TURN_2]


def prefilled(sched: Scheduler, engine, prompts: list[str], depth: int = 3) -> tuple[list, int]:
    """Every prompt as a row at once, as `run`; also the prompt tokens the steps prefilled in all."""
    seqs = [engine.new_sequence(engine.text_prompt(p), params(depth)) for p in prompts]
    for seq in seqs:
        sched.add(seq)
    total = 0
    while sched.active:
        total += sum(r.prefill for _, r, _ in sched.step() if r is not None)
    return seqs, total


@pytest.mark.parametrize("cache_bytes", [64 << 20, 0], ids=["a cache", "no cache"])
def test_one_new_prompt_arriving_twice_at_once_is_prefilled_once_and_stored_once(engine, reference, cache_bytes):
    cache = PrefixCache(cache_bytes)
    sched = Scheduler(2, prefix_cache=cache)
    n = len(engine.text_prompt(TURN_1))
    seqs, total = prefilled(sched, engine, [TURN_1, TURN_1])
    # the second waits for the first's snapshot a token before the end, then prefills that token
    assert [s.cached_tokens for s in seqs] == [0, n - 1] and total == n + 1
    assert [s.tokens for s in seqs] == [reference[TURN_1]] * 2
    if not cache_bytes:
        assert cache.stats.entries == 0
        return
    entries, size = cache.stats.entries, cache.stats.bytes
    run(sched, engine, [TURN_1])
    assert (cache.stats.entries, cache.stats.bytes) == (entries, size)
    # one node per chunk, the last ending a token before the prompt's end
    assert -(-(len(engine.text_prompt(TURN_1)) - 1) // CHUNK) == entries


def test_a_prompt_sharing_a_beginning_with_one_being_prefilled_resumes_from_its_snapshots(engine, reference):
    sched = Scheduler(2, prefix_cache=PrefixCache(64 << 20))
    a, b = engine.text_prompt(TURN_2), engine.text_prompt(OTHER)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    (first, other), total = prefilled(sched, engine, [TURN_2, OTHER])
    assert other.cached_tokens == shared // CHUNK * CHUNK > 0
    assert total == len(a) + len(b) - other.cached_tokens
    assert first.tokens == reference[TURN_2] and other.tokens == reference[OTHER]


def test_a_cancelled_prefill_leaves_nothing_in_the_cache(engine, reference):
    cache = PrefixCache(64 << 20)
    sched = Scheduler(1, prefix_cache=cache)
    seq = engine.new_sequence(engine.text_prompt(TURN_2), params(3))
    sched.add(seq)
    sched.step()
    sched.step()  # two chunks in, the prompt not yet
    assert seq.prefilled == 2 * CHUNK and not seq.tokens
    seq.cancelled = True
    sched.drop_cancelled()
    assert cache.stats.entries == 0 and cache.stats.bytes == 0
    (again,) = run(sched, engine, [TURN_2])
    assert again.cached_tokens == 0 and again.tokens == reference[TURN_2]


def test_a_next_turn_whose_first_token_merged_with_the_prompts_last_still_resumes(engine, reference):
    """The previous prompt's last token is not in the next prompt (a tokenizer merged it with the answer)."""
    cache = PrefixCache(64 << 20)
    sched = Scheduler(1, prefix_cache=cache)
    first = engine.text_prompt(TURN_1)
    run_ids(sched, engine, first)
    merged = first[:-1] + engine.text_prompt(" a.py b.py\nuser: open a.py\nassistant:")
    (seq,) = run_ids(sched, engine, merged)
    assert seq.cached_tokens == len(first) - 1
    assert seq.tokens == plain_greedy_ids(engine, merged)


def run_ids(sched, engine, prompt: list[int]):
    seq = engine.new_sequence(prompt, params(3))
    sched.add(seq)
    while sched.active:
        sched.step()
    return (seq,)


def plain_greedy_ids(engine, prompt: list[int]) -> list[int]:
    from mlx_lm.generate import generate_step

    return [t for t, _ in generate_step(mx.array(prompt), engine.target.model, max_tokens=MAX_TOKENS)]


def test_a_prompt_ended_by_its_first_token_is_still_cached(engine):
    cache = PrefixCache(64 << 20)
    sched = Scheduler(1, prefix_cache=cache)
    seq = engine.new_sequence(engine.text_prompt(TURN_1), params(3, max_tokens=1))
    sched.add(seq)
    while sched.active:
        sched.step()
    assert seq.finish_reason == "length" and cache.stats.entries > 0


def test_the_budget_holds_under_many_distinct_prompts_and_the_most_recent_stays(engine, reference):
    sched = Scheduler(1, prefix_cache=PrefixCache(1))
    run(sched, engine, [TURN_1])
    one_prompt = sched.prefix_cache.stats.evictions
    assert one_prompt > 0 and sched.prefix_cache.stats.bytes <= 1  # nothing fits a 1-byte budget

    probe = PrefixCache(64 << 20)
    run(Scheduler(1, prefix_cache=probe), engine, [TURN_1])
    budget = probe.stats.bytes * 3  # room for about three prompts of this size
    cache = PrefixCache(budget)
    sched = Scheduler(1, prefix_cache=cache)
    for i in range(8):
        run(sched, engine, [f"{i} {TURN_1}"])
        assert cache.stats.bytes <= budget
    assert cache.stats.evictions > 0
    (last,) = run(sched, engine, [f"7 {TURN_1}"])
    assert last.cached_tokens == len(engine.text_prompt(f"7 {TURN_1}")) - 1
    (first,) = run(sched, engine, [f"0 {TURN_1}"])
    assert first.cached_tokens == 0  # the least recently used went first


# -- the tree on its own ------------------------------------------------------------------


def stretch(tokens, state=True, size=100) -> Stretch:
    return Stretch(tokens=tuple(tokens), segment=[mx.zeros((size,), mx.uint8)],
                   end_state=[mx.zeros((size,), mx.uint8)] if state else None)


def test_lookup_takes_the_deepest_snapshot_the_prompt_begins_with():
    cache = PrefixCache(1 << 20)
    cache.insert(None, [stretch([1, 2]), stretch([3, 4]), stretch([5])])
    assert cache.lookup([1, 2, 3, 4, 5, 6]).length == 5
    assert cache.lookup([1, 2, 3, 4, 9]).length == 4
    assert cache.lookup([1, 2, 3]).length == 2
    assert cache.lookup([2, 1]) is None
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.tokens_reused) == (4, 3, 11)


def test_an_inner_snapshot_loses_its_state_before_a_more_recent_leaf_goes():
    cache = PrefixCache(1 << 20)
    cache.insert(None, [stretch([1, 2]), stretch([3, 4])])
    full = cache.stats.bytes
    cache.max_bytes = full - 1
    cache._evict()
    assert cache.lookup([1, 2, 3, 4]).length == 4  # the leaf stays
    assert cache.lookup([1, 2, 9]) is None  # the inner node has no state to resume from
    assert cache.stats.bytes == full - 100 and cache.stats.evictions == 1


def test_evicting_a_leaf_also_drops_ancestors_left_without_a_state_or_children():
    cache = PrefixCache(1 << 20)
    cache.insert(None, [stretch([1, 2], state=False), stretch([3, 4])])
    cache.max_bytes = 0
    cache._evict()
    assert cache.stats.entries == 0 and cache.stats.bytes == 0 and not cache.root.children


def test_a_zero_budget_disables_the_cache():
    cache = PrefixCache(0)
    cache.insert(None, [stretch([1, 2])])
    assert cache.lookup([1, 2]) is None and cache.stats.lookups == 0 and cache.stats.entries == 0


def test_of_two_stretches_that_both_begin_the_prompt_the_longer_is_taken():
    cache = PrefixCache(1 << 20)
    cache.insert(None, [stretch([1, 2])])
    cache.insert(None, [stretch([1, 2, 3])])  # e.g. a turn prefilled while the shorter was evicted
    assert cache.lookup([1, 2, 3, 4]).length == 3
    assert cache.lookup([1, 2, 9]).length == 2


def test_a_flood_of_one_token_prompts_keeps_the_newest_within_the_budget():
    per_entry = stretch([0]).nbytes
    cache = PrefixCache(per_entry * 10)
    for i in range(5000):
        cache.insert(None, [stretch([i])])
    assert cache.stats.entries == 10 and cache.stats.bytes <= per_entry * 10
    assert cache.lookup([4999]).length == 1 and cache.lookup([4989]) is None


def test_a_conversations_end_stays_resumable_longer_than_the_prompts_last_token():
    cache = PrefixCache(1 << 20)
    turn = Stretch(tokens=(1, 2, 3), segment=[mx.zeros((100,), mx.uint8)], end_state=[mx.zeros((100,), mx.uint8)], boundary=True)
    cache.insert(None, [turn, stretch([4, 5])])  # where the messages end, then one token before the prompt's end
    cache.max_bytes = cache.stats.bytes - 1
    cache._evict()
    # the next turn diverges inside the generation prompt: it still resumes where the conversation ended
    assert cache.lookup([1, 2, 3, 9]).length == 3
    assert cache.lookup([1, 2, 3, 4, 5]).length == 3


# -- with a disk tier ----------------------------------------------------------------------


def disk_tier(path, facts=None):
    from mtpstack.worker.prefix_disk import DiskTier

    return DiskTier(path, 1 << 30, facts or {"test": "prefix-cache"}).open()


@pytest.mark.parametrize("depth", [0, 3])
def test_a_restarted_worker_resumes_from_disk_with_the_targets_own_greedy_text(engine, reference, tmp_path, depth):
    first = disk_tier(tmp_path)
    run(Scheduler(1, prefix_cache=PrefixCache(64 << 20, disk=first)), engine, [TURN_1], depth)
    first.close()  # the process ends: its memory is gone, its directory stays
    disk = disk_tier(tmp_path)
    sched = Scheduler(1, prefix_cache=PrefixCache(64 << 20, disk=disk))
    (second,) = run(sched, engine, [TURN_2], depth)
    assert second.cached_tokens == len(engine.text_prompt(TURN_1)) - 1
    assert second.tokens == reference[TURN_2]
    assert disk.stats.hits == 1 and disk.stats.errors == 0 and len(disk.drain_restores()) == 1
    (again,) = run(sched, engine, [TURN_2], depth)  # the chain read back is in memory now
    assert again.cached_tokens == len(engine.text_prompt(TURN_2)) - 1 and disk.stats.hits == 1
    disk.close()


def test_what_memory_evicts_is_resumed_from_disk(engine, reference, tmp_path):
    disk = disk_tier(tmp_path)
    cache = PrefixCache(1, disk=disk)  # nothing stays in memory
    sched = Scheduler(2, prefix_cache=cache)
    run(sched, engine, [TURN_1])
    assert cache.stats.bytes <= 1 and cache.stats.evictions > 0
    disk.flush(30)
    (second, other) = run(sched, engine, [TURN_2, OTHER])
    assert second.cached_tokens == len(engine.text_prompt(TURN_1)) - 1 and other.cached_tokens > 0
    assert second.tokens == reference[TURN_2] and other.tokens == reference[OTHER]
    disk.close()


def test_a_damaged_snapshot_on_disk_is_a_miss_and_the_text_is_unchanged(engine, reference, tmp_path):
    first = disk_tier(tmp_path)
    run(Scheduler(1, prefix_cache=PrefixCache(64 << 20, disk=first)), engine, [TURN_1])
    first.close()
    for f in first.folder.glob("*.st"):
        f.write_bytes(f.read_bytes()[:-1] + b"\0")  # every end state's last byte
    disk = disk_tier(tmp_path)
    (second,) = run(Scheduler(1, prefix_cache=PrefixCache(64 << 20, disk=disk)), engine, [TURN_2])
    assert second.tokens == reference[TURN_2] and second.finish_reason == "length"
    assert disk.stats.errors >= 1 and disk.stats.hits == 0
    disk.close()


def test_another_models_snapshots_are_not_read(engine, reference, tmp_path):
    first = disk_tier(tmp_path, {"target": "one"})
    run(Scheduler(1, prefix_cache=PrefixCache(64 << 20, disk=first)), engine, [TURN_1])
    first.close()
    disk = disk_tier(tmp_path, {"target": "another"})
    (second,) = run(Scheduler(1, prefix_cache=PrefixCache(64 << 20, disk=disk)), engine, [TURN_2])
    assert second.cached_tokens == 0 and second.tokens == reference[TURN_2] and disk.stats.hits == 0
    disk.close()
