"""Logprobs from the verified logits equal plain decoding's, at every depth, on the same token sequence."""

from __future__ import annotations

import mlx.core as mx
import pytest

from devkit.engine import step
from mtpstack.worker.loading import Engine
from mtpstack.worker.sequence import SamplingParams
from mtpstack.worker.protocol.hooks import RowHook

PROMPT_TEXT = "def fibonacci(n):\n    "
TOKENS = 40
TOP = 5


class Force:
    """Forces the sequence `tokens` (a test's stand-in for a grammar): at every verified position the
    next token of the sequence, as long as the draft before that position follows it."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.done = tokens, 0

    def mask(self, logits: mx.array, drafted: list[int]) -> mx.array:
        allow = [[False] * logits.shape[1] for _ in range(logits.shape[0])]
        for j in range(logits.shape[0]):
            at = self.done + j
            if at >= len(self.tokens) or drafted[:j] != self.tokens[self.done:at]:
                allow[j] = [True] * logits.shape[1]
            else:
                allow[j][self.tokens[at]] = True
        return mx.where(mx.array(allow), logits, mx.array(-float("inf")))

    def advance(self, tokens: list[int]) -> None:
        self.done += len(tokens)


def run(engine: Engine, prompt: list[int], depth: int, force: list[int] | None):
    seq = engine.new_sequence(prompt, SamplingParams(max_tokens=TOKENS, depth=depth, ignore_eos=True))
    seq.hook = RowHook(TOP, Force(force) if force else None)
    while not seq.finished:
        step(seq)
    return seq


@pytest.fixture(scope="module")
def engines(tiny_pair):
    target, drafter = tiny_pair
    return Engine.load(str(target), None), Engine.load(str(target), str(drafter), draft_depth=4)


def test_speculative_logprobs_equal_plain_ones_at_every_depth_on_the_same_tokens(engines):
    plain_engine, spec_engine = engines
    prompt = plain_engine.text_prompt(PROMPT_TEXT)
    plain = run(plain_engine, prompt, 0, None)
    reference = plain.hook.logprobs
    assert len(reference) == TOKENS and [e.token for e in reference] == plain.tokens
    for depth in (1, 2, 3, 4):
        spec = run(spec_engine, prompt, depth, plain.tokens)
        assert spec.tokens == plain.tokens and spec.drafted > 0 and spec.accepted > 0
        got = spec.hook.logprobs
        assert len(got) == TOKENS
        for i, (a, b) in enumerate(zip(got, reference)):
            assert a.token == b.token
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4), (depth, i)
            assert [t for t, _ in a.top] == [t for t, _ in b.top], (depth, i)
            assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-4), (depth, i)


def test_a_forced_token_the_target_would_not_pick_gets_its_raw_logprob(engines):
    plain_engine, _ = engines
    prompt = plain_engine.text_prompt(PROMPT_TEXT)
    free = run(plain_engine, prompt, 0, None)
    forced_tokens = [t + 1 if t + 1 < 1000 else t - 1 for t in free.tokens]
    forced = run(plain_engine, prompt, 0, forced_tokens)
    first = forced.hook.logprobs[0]
    assert forced.tokens == forced_tokens
    # The mask made token forced_tokens[0] certain; its logprob is still the raw distribution's.
    assert first.logprob < first.top[0][1] and first.top[0][0] == free.tokens[0]
