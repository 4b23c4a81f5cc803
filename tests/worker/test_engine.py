"""The engine in-process: speculation changes speed, never text."""

from __future__ import annotations

import pytest

from devkit.engine import chat_prompt, step
from mtpstack.worker.loading import Engine
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams
from tests.worker.greedy import PROMPTS, plain_greedy

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def engine(tiny_pair) -> Engine:
    target, drafter = tiny_pair
    return Engine.load(str(target), str(drafter), draft_depth=6)


@pytest.fixture(scope="module")
def reference(engine) -> dict[str, list[int]]:
    """The target's own greedy tokens from mlx-lm's plain `generate_step`."""
    return plain_greedy(engine, MAX_TOKENS)


def run(engine: Engine, prompt: list[int], **kw) -> "Sequence":  # noqa: F821
    seq = engine.new_sequence(prompt, SamplingParams(**{"max_tokens": MAX_TOKENS, "ignore_eos": True, **kw}))
    while not seq.finished:
        step(seq)
    return seq


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 4, 5, 6])
def test_greedy_output_equals_the_targets_own_greedy_output_at_every_depth(engine, reference, depth):
    for prompt in PROMPTS:
        seq = run(engine, engine.text_prompt(prompt), depth=depth)
        assert seq.tokens == reference[prompt], f"depth {depth}, prompt {prompt!r}"
        if depth:
            assert seq.drafted > 0


def test_without_a_drafter_the_output_is_the_same(tiny_pair, reference):
    plain = Engine.load(str(tiny_pair[0]), None)
    assert plain.draft_depth == 0
    for prompt in PROMPTS[:2]:
        seq = run(plain, plain.text_prompt(prompt), depth=3)
        assert seq.tokens == reference[prompt]
        assert seq.drafted == 0


def test_a_drafter_identical_to_the_target_has_every_token_accepted(echo_pair):
    target, drafter = echo_pair
    eng = Engine.load(str(target), str(drafter), draft_depth=4)
    seq = run(eng, eng.text_prompt("def main():"), depth=4, max_tokens=41)
    # 41 tokens = 8 steps of 4 accepted + 1 corrected... every draft matches, so each step emits depth+1.
    assert seq.drafted == seq.accepted > 0
    assert len(seq.tokens) == 41


def test_the_drafter_never_drafts_what_could_not_be_emitted(engine):
    seq = engine.new_sequence(engine.text_prompt("def main():"), SamplingParams(max_tokens=3, depth=6, ignore_eos=True))
    while not seq.finished:
        left = 3 - len(seq.tokens)
        assert step(seq).drafted <= left - 1
    assert len(seq.tokens) == 3


def test_a_lower_request_depth_drafts_fewer_tokens_per_step(engine):
    seq = engine.new_sequence(engine.text_prompt("def main():"), SamplingParams(max_tokens=30, depth=1, ignore_eos=True))
    while not seq.finished:
        result = step(seq)
        assert result.drafted <= 1


def test_chat_prompts_go_through_the_models_chat_template(engine):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    ids = chat_prompt(engine, messages)
    text = engine.tokenizer.decode(ids)
    assert "<|im_start|>user\nhello there<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert ids == list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def test_a_stop_string_cuts_the_text_before_it(engine, reference):
    prompt = PROMPTS[1]
    full = run(engine, engine.text_prompt(prompt), depth=3).text
    stop = full[10:13]
    assert stop and full.find(stop) >= 0
    seq = run(engine, engine.text_prompt(prompt), depth=3, stop=[stop])
    assert seq.finish_reason == "stop"
    assert seq.text == full[: full.find(stop)]
    assert seq.take_text() == seq.text


def test_streamed_pieces_never_show_a_stop_string_prefix_too_early(engine):
    prompt = engine.text_prompt(PROMPTS[0])
    full = run(engine, prompt, depth=2).text
    stop = full[15:19]
    seq = engine.new_sequence(prompt, SamplingParams(max_tokens=MAX_TOKENS, depth=2, stop=[stop], ignore_eos=True))
    pieces = []
    while not seq.finished:
        step(seq)
        pieces.append(seq.take_text())
    assert "".join(pieces) == full[: full.find(stop)]


def test_interleaved_sequences_produce_what_each_produces_alone(engine, reference):
    sched = Scheduler(max_num_seqs=3)
    seqs = [engine.new_sequence(engine.text_prompt(p), SamplingParams(max_tokens=MAX_TOKENS, depth=d, ignore_eos=True))
            for p, d in zip(PROMPTS[:3], (1, 3, 6))]
    for s in seqs:
        sched.add(s)
    rounds = 0
    while sched.active:
        sched.step()
        rounds += 1
        # all three make progress together: none finishes while another has not started emitting
        if any(s.finished for s in seqs):
            assert all(s.tokens for s in seqs)
    for p, s in zip(PROMPTS[:3], seqs):
        assert s.tokens == reference[p]


@pytest.mark.parametrize("depth", [0, 2, 5])
def test_sequences_verified_in_one_batch_produce_what_each_produces_alone(engine, reference, depth):
    prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[4]]  # different lengths: the rows are ragged
    sched = Scheduler(max_num_seqs=3)
    seqs = [engine.new_sequence(engine.text_prompt(p), SamplingParams(max_tokens=MAX_TOKENS, depth=depth, ignore_eos=True))
            for p in prompts]
    for s in seqs:
        sched.add(s)
    while sched.active:
        sched.step()
    assert sched.batched_steps > 0
    for p, s in zip(prompts, seqs):
        assert s.tokens == reference[p], p


def test_prompts_arriving_together_all_emit_their_first_token_in_the_first_step(engine, reference):
    prompts = PROMPTS[:4]  # 4 to 12 tokens: the rows join the batch with different lengths
    sched = Scheduler(max_num_seqs=4)
    seqs = [engine.new_sequence(engine.text_prompt(p), SamplingParams(max_tokens=MAX_TOKENS, depth=2, ignore_eos=True))
            for p in prompts]
    for s in seqs:
        sched.add(s)
    sched.step()
    assert all(len(s.tokens) == 1 and s.decoding for s in seqs)
    while sched.active:
        sched.step()
    for p, s in zip(prompts, seqs):
        assert s.tokens == reference[p], p


def test_a_sequence_alone_and_then_joined_by_another_keeps_its_text(engine, reference):
    sched = Scheduler(max_num_seqs=2)
    a = engine.new_sequence(engine.text_prompt(PROMPTS[0]), SamplingParams(max_tokens=MAX_TOKENS, depth=0, ignore_eos=True))
    sched.add(a)
    for _ in range(10):
        sched.step()
    b = engine.new_sequence(engine.text_prompt(PROMPTS[1]), SamplingParams(max_tokens=MAX_TOKENS, depth=0, ignore_eos=True))
    sched.add(b)
    while sched.active:
        sched.step()
    assert sched.batched_steps > 0
    assert a.tokens == reference[PROMPTS[0]]
    assert b.tokens == reference[PROMPTS[1]]


def test_a_cancelled_sequence_leaves_before_its_next_step(engine):
    sched = Scheduler(max_num_seqs=2)
    a = engine.new_sequence(engine.text_prompt("abc"), SamplingParams(max_tokens=20, depth=2, ignore_eos=True))
    b = engine.new_sequence(engine.text_prompt("abc"), SamplingParams(max_tokens=20, depth=2, ignore_eos=True))
    sched.add(a)
    sched.add(b)
    sched.step()
    a.cancelled = True
    produced = len(a.tokens)
    assert sched.drop_cancelled() == [a]
    sched.step()
    assert sched.active == [b]
    assert a.finish_reason == "cancelled" and len(a.tokens) == produced


def test_sampling_with_a_seed_is_reproducible_and_differs_from_greedy(engine, reference):
    prompt = engine.text_prompt(PROMPTS[0])
    one = run(engine, prompt, depth=3, temperature=1.0, seed=7)
    two = run(engine, prompt, depth=3, temperature=1.0, seed=7)
    assert one.tokens == two.tokens
    assert one.tokens != reference[PROMPTS[0]]


def test_identity_hash_changes_when_a_weight_file_changes(tiny_pair, tmp_path, pair_copier):
    from mtpstack.worker.proof import hash_weights

    target, _ = pair_copier(tiny_pair, tmp_path)
    before = hash_weights(target)
    assert Engine.load(str(target), None).target.sha256 == before
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    assert hash_weights(target) != before


def test_the_demo_chat_template_takes_content_as_a_string_or_as_text_parts(engine):
    as_string = chat_prompt(engine, [{"role": "user", "content": "hi there"}])
    as_parts = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
        add_generation_prompt=True,
    )
    assert as_string == list(as_parts)


@pytest.mark.parametrize("chunk", [1, 3])
def test_a_prompt_prefilled_over_several_chunks_gives_what_one_chunk_gives(engine, reference, monkeypatch, chunk):
    import mtpstack.worker.sequence as sequence_module

    prompt = PROMPTS[3]
    whole = run(engine, engine.text_prompt(prompt), depth=3)
    monkeypatch.setattr(sequence_module, "PREFILL_CHUNK", chunk)
    chunked = run(engine, engine.text_prompt(prompt), depth=3)
    assert chunked.tokens == whole.tokens == reference[prompt]
    assert (chunked.drafted, chunked.accepted) == (whole.drafted, whole.accepted)


@pytest.mark.parametrize(("claim", "config", "says"), [
    ("6", {"quantization": {"bits": 4, "group_size": 64}}, "claimed 6, config.json records 4"),
    ("bf16", {"quantization": {"bits": 4, "group_size": 64}}, "claimed bf16, config.json records 4"),
    ("4", {"text_config": {"torch_dtype": "bfloat16"}}, "claimed 4, config.json records bf16"),
    ("4", {"quantization": {"bits": 4, "group_size": 64}}, None),
    ("fp32", {}, None),  # nothing recorded: nothing to compare
])
def test_identity_and_deep_compare_the_bits_claim_the_same_way(tmp_path, claim, config, says):
    """One comparison (`validator.bits_disagreement`): the worker's `/identity` says what `--deep` says."""
    from pathlib import Path

    from mtpstack.validator import bits_disagreement
    from mtpstack.worker.loading import LoadedModel, bits_mismatch

    loaded = LoadedModel(path="m", resolved_path=Path(tmp_path), model=None, config=config, bits=claim, sha256="")
    assert bits_mismatch(loaded) == says
    assert (bits_disagreement(claim, config) is None) == (says is None)
