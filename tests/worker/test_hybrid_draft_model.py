"""Separate draft models beside hybrid targets: an attention-only one is served losslessly; a recurrent one
is refused before `/health` ever answers 200, never healthy-then-dead."""

from __future__ import annotations

import shutil

import pytest

from mtpstack.runtime import StartError
from mtpstack.worker.loading import Engine
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams
from tests.worker.greedy import PROMPTS, plain_greedy

MAX_TOKENS = 20


@pytest.mark.parametrize("width", [1, 4])
def test_an_attention_only_draft_model_drafts_for_a_hybrid_target_losslessly(hybrid_pair, tiny_pair, width):
    target, _ = hybrid_pair
    _, drafter = tiny_pair  # a qwen3 model of the same vocabulary: plain KV caches
    engine = Engine.load(str(target), str(drafter), draft_depth=3)
    assert engine.draft_kind == "model" and "gated-delta" in engine.cache_kinds
    sched = Scheduler(max_num_seqs=width)
    seqs = {p: engine.new_sequence(engine.text_prompt(p), SamplingParams(max_tokens=MAX_TOKENS, depth=3, ignore_eos=True))
            for p in PROMPTS[:width]}
    for seq in seqs.values():
        sched.add(seq)
    while sched.active:
        for _, _, error in sched.step():
            assert error is None
    expected = plain_greedy(engine, MAX_TOKENS, list(seqs))
    assert {p: s.tokens for p, s in seqs.items()} == expected
    assert sum(s.drafted for s in seqs.values()) > 0


def test_a_worker_with_a_recurrent_draft_model_exits_before_it_is_ever_healthy(hybrid_pair, live_worker, tmp_path):
    target, _ = hybrid_pair
    draft = shutil.copytree(target, tmp_path / "hybrid-draft")  # another directory: a separate draft model
    worker = live_worker(target, draft)
    with pytest.raises(StartError) as e:
        with worker:
            pass
    assert e.value.exited and e.value.exit_code != 0
    log = worker.proc.log_path.read_text()
    assert f"the draft model `{draft}` keeps recurrent" in log
    assert f"the target `{target}`" in log
    assert "--draft-kind mtp" in log  # the fix
