"""A failure in one row's own work ends that row only: the other rows of the batched step finish as if alone."""

from __future__ import annotations

import pytest

from mtpstack.worker.loading import Engine
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams
from tests.worker.greedy import PROMPTS, plain_greedy

MAX_TOKENS = 24


class Broken(RuntimeError):
    pass


class FailingHook:
    """A request's sampling hook (as a grammar is) that fails at its `at`-th call of `where`."""

    def __init__(self, where: str, at: int):
        self.where, self.at, self.calls = where, at, 0

    def _tick(self, where: str) -> None:
        if where == self.where:
            self.calls += 1
            if self.calls == self.at:
                raise Broken(f"{where} failed")

    def constrain(self, logits, drafted):
        self._tick("constrain")
        return logits

    def observe(self, logits, tokens):
        self._tick("observe")


@pytest.fixture(scope="module")
def engine(hybrid_pair) -> Engine:
    target, head = hybrid_pair
    return Engine.load(str(target), str(head), draft_depth=3)


@pytest.mark.parametrize("where", ["constrain", "observe"])
def test_a_row_whose_hook_fails_mid_batch_ends_alone_and_the_others_finish_correctly(engine, where):
    reference = plain_greedy(engine, MAX_TOKENS, PROMPTS[:4])
    sched = Scheduler(max_num_seqs=4)
    seqs = [engine.new_sequence(engine.text_prompt(p), SamplingParams(max_tokens=MAX_TOKENS, depth=3, ignore_eos=True))
            for p in PROMPTS[:4]]
    broken = seqs[1]
    broken.hook = FailingHook(where, at=4)  # past the prefill's call: inside a batched decode step
    for seq in seqs:
        sched.add(seq)
    errors, steps_with_others = [], 0
    while sched.active:
        for seq, result, error in sched.step():
            if error is not None:
                errors.append((seq, error))
            elif seq is not broken and result is not None and result.drafted:
                steps_with_others += 1
    assert [(seq, type(e)) for seq, e in errors] == [(broken, Broken)]
    assert broken.finish_reason == "error" and len(broken.tokens) < MAX_TOKENS
    for seq, prompt in zip(seqs, PROMPTS[:4]):
        if seq is not broken:
            assert seq.finish_reason == "length"
            assert seq.tokens == reference[prompt]
    assert steps_with_others > 0
