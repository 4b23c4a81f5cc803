"""Prompts being prefilled share one forward a step, within a time budget beside the decoding rows (worker/pacing.py)."""

from __future__ import annotations

import pytest

import mtpstack.worker.sequence as sequence_module
from mtpstack.worker.loading import Engine
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams
from tests.worker.greedy import plain_greedy

LONG = "Copyright (C) 2024 Free Software Foundation, Inc.\n" * 8
PROMPTS = ["def main():", LONG, "import os\nimport sys\n" * 4]


@pytest.fixture(scope="module")
def engine(hybrid_pair) -> Engine:
    return Engine.load(str(hybrid_pair[0]), str(hybrid_pair[1]), draft_depth=3)


def params(max_tokens=24, depth=3) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, depth=depth, ignore_eos=True)


def count_forwards(engine, monkeypatch) -> list:
    calls = []
    real = type(engine.parts).hidden

    def hidden(self, tokens, cache):
        calls.append(tokens.shape)
        return real(self, tokens, cache)

    monkeypatch.setattr(type(engine.parts), "hidden", hidden)
    return calls


def test_prompts_arriving_together_are_prefilled_in_one_forward_and_keep_their_own_text(engine, monkeypatch):
    monkeypatch.setattr(sequence_module, "PREFILL_CHUNK", 16)
    reference = plain_greedy(engine, 24, PROMPTS)
    sched = Scheduler(3)
    seqs = [engine.new_sequence(engine.text_prompt(p), params()) for p in PROMPTS]
    for seq in seqs:
        sched.add(seq)
    calls = count_forwards(engine, monkeypatch)
    sched.step()
    assert calls == [(3, 16)]  # one forward: three rows, each at most one 16-token chunk
    while sched.active:
        sched.step()
    assert [s.tokens for s in seqs] == [reference[p] for p in PROMPTS]


def test_a_decoding_row_gets_tokens_every_step_while_a_long_prompt_is_prefilled_in_chunks_sized_by_time(engine, monkeypatch):
    monkeypatch.setattr(sequence_module, "PREFILL_CHUNK", 64)
    reference = plain_greedy(engine, 64, [PROMPTS[0], LONG])
    sched = Scheduler(2)
    a = engine.new_sequence(engine.text_prompt(PROMPTS[0]), params(64))
    sched.add(a)
    for _ in range(3):
        sched.step()
    b = engine.new_sequence(engine.text_prompt(LONG), params(64))
    sched.add(b)
    chunks, asked = [], []
    real_share = sched.pacer.share
    monkeypatch.setattr(sched.pacer, "share", lambda *args: asked.append(real_share(*args)) or asked[-1])
    while not b.tokens:
        results = {seq: r for seq, r, _ in sched.step()}
        assert results[a].tokens >= 1  # the decoding row never waits for the prompt
        chunks.append(results[b].prefill if b in results else 0)
    assert asked and len(asked) == len(chunks)  # every step beside a decoding row was sized by the pacer
    assert all((0 < c <= s) if s else c == 0 for c, s in zip(chunks, asked))  # none ran more than it was given
    while sched.active:
        sched.step()
    assert a.tokens == reference[PROMPTS[0]] and b.tokens == reference[LONG]


def test_nothing_decoding_gives_each_prompt_a_whole_chunk(engine):
    sched = Scheduler(3)
    assert sched._share([], 1) == sequence_module.PREFILL_CHUNK == sched._share([], 3)
