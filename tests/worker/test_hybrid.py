"""Hybrid (Qwen3.5-family) targets with MTP heads: every rejected draft is rolled back exactly, in every layer."""

from __future__ import annotations

import mlx.core as mx
import pytest

from devkit.engine import step
from mtpstack.worker.caches import StepStateCache
from mtpstack.worker.batch import Batch
from mtpstack.worker.loading import Engine
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams
from tests.worker.greedy import PROMPTS, ForcedDrafter, decode_forced, plain_greedy

MAX_TOKENS = 32
#: Long enough for a row to meet every acceptance length at depth 6 before its last steps draft less.
FORCED_TOKENS = 64


@pytest.fixture(scope="module")
def engine(hybrid_pair) -> Engine:
    target, head = hybrid_pair
    return Engine.load(str(target), str(head), draft_depth=6)


@pytest.fixture(scope="module")
def reference(engine) -> dict[str, list[int]]:
    """The target's own greedy tokens from mlx-lm's plain `generate_step` (its own caches, no speculation)."""
    return plain_greedy(engine, MAX_TOKENS)


@pytest.fixture(scope="module")
def long_reference(engine) -> dict[str, list[int]]:
    return plain_greedy(engine, FORCED_TOKENS)


def params(depth: int, **kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": MAX_TOKENS, "depth": depth, "ignore_eos": True, **kw})


def run_all(engine, prompts, depths, width):
    sched = Scheduler(max_num_seqs=width)
    seqs = [engine.new_sequence(engine.text_prompt(p), params(d)) for p, d in zip(prompts, depths)]
    steps = []
    for s in seqs:
        sched.add(s)
    while sched.active:
        steps += [(seq, r) for seq, r, _ in sched.step() if r is not None and r.drafted]
    return sched, seqs, steps


def test_the_engine_detects_a_head_and_keeps_step_states_for_the_gated_delta_layers(engine):
    assert engine.draft_kind == "mtp"
    assert engine.drafter.identity()["kind"] == "mtp"
    assert {"kv", "gated-delta"} <= set(engine.cache_kinds)


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 4, 5, 6])
def test_greedy_output_equals_the_targets_plain_greedy_output_at_every_depth(engine, reference, depth):
    drafted = accepted = 0
    for prompt in PROMPTS:
        _, (seq,), _ = run_all(engine, [prompt], [depth], 1)
        assert seq.tokens == reference[prompt], f"depth {depth}, prompt {prompt!r}"
        drafted += seq.drafted
        accepted += seq.accepted
    if depth:
        assert 0 < accepted < drafted  # both accepted and rejected drafts happened


@pytest.mark.parametrize("width", [2, 3, 4])
def test_rows_of_mixed_lengths_and_depths_each_produce_what_they_produce_alone(engine, reference, width):
    prompts = PROMPTS[:width] if width < 4 else [PROMPTS[4], PROMPTS[3], PROMPTS[0], PROMPTS[1]]
    depths = [1, 6, 3, 2][:width]
    sched, seqs, steps = run_all(engine, prompts, depths, width)
    assert sched.batched_steps > 0
    for p, s in zip(prompts, seqs):
        assert s.tokens == reference[p], p
    # rows accepted different lengths within one step
    assert len({r.accepted for _, r in steps}) > 1


class ScriptedDrafter:
    """Proposes the target's true greedy continuation with its first error at a chosen position.

    Wraps the engine's real head drafter (its caches and seeds stay in step) but
    replaces the proposals, so a test can force every acceptance length 0..k and
    check that the target's rollback (KV lengths and gated-delta states) is exact.
    """

    def __init__(self, inner, truth: list[int], wrong_at: list[int], vocab: int):
        self.inner, self.truth, self.wrong_at, self.vocab = inner, truth, wrong_at, vocab
        self.step = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft(self, rows, depth):
        self.inner.draft(rows, depth)  # keeps the head's own caches in step
        (seq,) = rows
        done = len(seq.tokens)
        good = self.truth[done : done + depth] + [0] * depth
        bad_at = self.wrong_at[self.step % len(self.wrong_at)]
        self.step += 1
        proposal = [good[i] if i < bad_at else (good[i] + 1) % self.vocab for i in range(depth)]
        return mx.array([proposal], dtype=mx.uint32)


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_every_acceptance_length_rolls_back_exactly(engine, reference, depth):
    prompt = PROMPTS[2]
    seq = engine.new_sequence(engine.text_prompt(prompt), params(depth))
    sched = Scheduler(max_num_seqs=1)
    sched.add(seq)
    batch: Batch = sched.batch
    batch.drafter = ScriptedDrafter(batch.drafter, reference[prompt], list(range(depth + 1)), engine.vocab_size)
    seen = set()
    while sched.active:
        for _, r, _ in sched.step():
            if r is not None and r.drafted == depth:
                seen.add(r.accepted)
    assert seq.tokens == reference[prompt]
    assert seen == set(range(depth + 1))


@pytest.fixture(params=["kept per position", "replayed"])
def recurrence(request, monkeypatch) -> str:
    """Both ways a gated-delta layer sets a row's state after its kept positions: the CPU's (every
    position's state kept, as mlx-lm's ops loop yields them) and the Metal kernel's (one call over all
    positions, the rejected ones replayed at commit), the second run here through mlx-lm's ops."""
    import mtpstack.worker.caches as caches

    monkeypatch.setattr(caches, "_runs_kernel", lambda k: request.param == "replayed")
    return request.param


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5, 6])
def test_every_acceptance_length_in_every_row_of_a_batch_leaves_the_targets_greedy_text(engine, long_reference, depth, width, recurrence):
    prompts = PROMPTS[:width]
    tokens, seen, ragged = decode_forced(engine, prompts, depth, long_reference, FORCED_TOKENS)
    for prompt, got in zip(prompts, tokens):
        assert got == long_reference[prompt], prompt
    assert seen == [set(range(depth + 1))] * width  # every row accepted 0, 1, ..., depth drafts
    assert ragged or width == 1  # and rows of one step accepted different lengths


def test_each_rows_recurrent_state_after_a_step_of_different_acceptances_is_the_plain_forwards(engine, long_reference, recurrence):
    """Rows rejecting at positions 0, 1 and 2 and one accepting all, in one step: every row's state is a plain forward's."""
    from mlx_lm.models.cache import make_prompt_cache

    prompts = PROMPTS[:4]
    sched = Scheduler(max_num_seqs=4)
    seqs = [engine.new_sequence(engine.text_prompt(p), params(3)) for p in prompts]
    for seq in seqs:
        sched.add(seq)
    sched.step()  # prefill: every first token is out
    sched.batch.drafter = ForcedDrafter(sched.batch.drafter, {s: long_reference[p] for s, p in zip(seqs, prompts)}, engine.vocab_size)
    assert [r.accepted for _, r, _ in sched.step()] == [0, 1, 2, 3]
    for r, (seq, prompt) in enumerate(zip(sched.batch.rows, prompts)):
        plain = make_prompt_cache(engine.target.model)
        engine.target.model(mx.array(engine.text_prompt(prompt) + seq.tokens[:-1])[None], cache=plain)
        for mine, theirs in zip(sched.batch.caches, plain):
            if isinstance(mine, StepStateCache):
                # Up to rounding: the prompt went in through the chunked recurrence (worker/gated_delta.py).
                assert mx.allclose(mine[0][r], theirs[0][0], atol=1e-5) and mx.allclose(mine[1][r], theirs[1][0], atol=1e-5)
            else:
                assert mine.lengths[r] == theirs.offset


def test_gated_delta_state_after_a_rolled_back_step_equals_the_plain_state(engine):
    """After a step whose drafts are all rejected, each gated-delta layer's state is the plain one's."""
    prompt = engine.text_prompt(PROMPTS[0])
    seq = engine.new_sequence(prompt, params(4))
    sched = Scheduler(max_num_seqs=1)
    sched.add(seq)
    sched.step()  # prefill: the first token is out
    sched.batch.drafter = ScriptedDrafter(sched.batch.drafter, [0] * 64, [0], engine.vocab_size)
    sched.step()  # every draft rejected: one token kept
    from mlx_lm.models.cache import make_prompt_cache

    plain = make_prompt_cache(engine.target.model)
    engine.target.model(mx.array(prompt + seq.tokens[:-1])[None], cache=plain)
    for mine, theirs in zip(sched.batch.caches, plain):
        if isinstance(mine, StepStateCache):
            # Up to rounding: the prompt went in through the chunked recurrence (worker/gated_delta.py).
            assert mx.allclose(mine[0], theirs[0], atol=1e-5) and mx.allclose(mine[1], theirs[1], atol=1e-5)
        else:
            assert mine.lengths == [theirs.offset]


def test_a_row_cancelled_mid_batch_leaves_the_others_untouched(engine, reference):
    sched = Scheduler(max_num_seqs=3)
    seqs = [engine.new_sequence(engine.text_prompt(p), params(3)) for p in PROMPTS[:3]]
    for s in seqs:
        sched.add(s)
    for _ in range(3):
        sched.step()
    seqs[1].cancelled = True
    assert sched.drop_cancelled() == [seqs[1]]
    assert len(sched.batch.rows) == 2
    while sched.active:
        sched.step()
    assert seqs[0].tokens == reference[PROMPTS[0]]
    assert seqs[2].tokens == reference[PROMPTS[2]]
    assert seqs[1].finish_reason == "cancelled"


def test_a_row_that_joins_a_running_batch_gets_its_own_text(engine, reference):
    sched = Scheduler(max_num_seqs=2)
    a = engine.new_sequence(engine.text_prompt(PROMPTS[3]), params(4))
    sched.add(a)
    for _ in range(4):
        sched.step()
    b = engine.new_sequence(engine.text_prompt(PROMPTS[1]), params(2))
    sched.add(b)
    while sched.active:
        sched.step()
    assert a.tokens == reference[PROMPTS[3]] and b.tokens == reference[PROMPTS[1]]


def test_sampling_with_a_seed_is_reproducible_on_a_hybrid_target(engine, reference):
    prompt = engine.text_prompt(PROMPTS[0])
    runs = []
    for _ in range(2):
        seq = engine.new_sequence(prompt, params(3, temperature=1.0, seed=11))
        while not seq.finished:
            step(seq)
        runs.append(seq.tokens)
    assert runs[0] == runs[1] and runs[0] != reference[PROMPTS[0]]


def test_a_model_kind_declared_for_a_head_folder_is_refused_with_a_hint(hybrid_pair):
    target, head = hybrid_pair
    with pytest.raises(ValueError, match="names an MTP head folder") as e:
        Engine.load(str(target), str(head), draft_kind="model")
    assert "--draft-kind mtp" in str(e.value)


def test_a_target_whose_cache_cannot_be_rolled_back_is_refused_naming_the_layer(tmp_path):
    from mtpstack.worker.caches import CacheNotSupported, install_rollback
    from mlx_lm.models import mamba

    model = mamba.Model(mamba.ModelArgs(model_type="mamba", vocab_size=32, hidden_size=16, intermediate_size=32,
                                        state_size=4, num_hidden_layers=1, conv_kernel=2, use_bias=False,
                                        use_conv_bias=False, time_step_rank=2))
    with pytest.raises(CacheNotSupported, match="layer 0 .*cannot roll back"):
        install_rollback(model)


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_a_prompt_prefilled_over_several_chunks_drafts_as_one_prefilled_at_once(engine, reference, monkeypatch, chunk):
    import mtpstack.worker.sequence as sequence_module

    prompt = PROMPTS[3]  # 12 tokens
    whole = engine.new_sequence(engine.text_prompt(prompt), params(3))
    while not whole.finished:
        step(whole)
    monkeypatch.setattr(sequence_module, "PREFILL_CHUNK", chunk)
    chunked = engine.new_sequence(engine.text_prompt(prompt), params(3))
    while not chunked.finished:
        step(chunked)
    assert chunked.tokens == whole.tokens == reference[prompt]
    assert (chunked.drafted, chunked.accepted) == (whole.drafted, whole.accepted)


def test_a_hybrid_draft_model_is_refused_at_load_naming_it_and_the_fix(hybrid_pair):
    target, _ = hybrid_pair
    with pytest.raises(ValueError, match="keeps recurrent") as e:
        Engine.load(str(target), str(target), draft_kind="model")  # a hybrid as its own separate draft model
    assert f"`{target}`" in str(e.value) and "--draft-kind mtp" in str(e.value)
