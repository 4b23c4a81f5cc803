"""The prefill's time budget beside decoding rows (worker/pacing.py), on a clock the test sets."""

from __future__ import annotations

import pytest

from mtpstack.worker import pacing
from mtpstack.worker.pacing import Pacer


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_before_any_measurement_the_first_chunk_is_small():
    assert Pacer().share(1, 512) == pacing.MIN_PREFILL_SHARE


def test_the_chunk_fills_the_gap_a_decode_step_leaves():
    p = Pacer()
    p.decoded(0.1)
    p.prefilled(1000, 1.0, beside=False)  # nothing decoded beside it: nothing owed
    assert p.debt == 0.0
    assert p.share(1, 512) == 300  # 0.1 s decode + 0.3 s of prompt = MAX_GAP
    assert p.share(4, 512) == 75  # split between the prefilling rows
    assert p.share(1, 64) == 64  # never past the chunk (the snapshot interval)
    assert p.share(40, 512) == pacing.MIN_PREFILL_SHARE  # every row moves, however slow


def test_a_chunk_beside_decoding_rows_waits_until_they_had_their_share():
    """The prefill owes the decoding rows its seconds; decode steps pay it back (DECODE_SHARE 0.5: second
    for second), and no chunk runs while it is owed, so both get half the time."""
    p = Pacer()
    p.decoded(0.1)
    p.prefilled(300, 0.3)
    assert p.budget_tokens() == 0 and p.share(1, 512) == 0
    decode_steps = 0
    while p.share(1, 512) == 0:
        p.decoded(0.1)
        decode_steps += 1
    assert decode_steps == 3  # 0.3 s of decoding for 0.3 s of prefill
    p.prefilled(300, 0.3)
    p.step_ended(decoding=False)  # the decoding rows left: nothing is owed to them
    assert p.debt == 0.0


def test_sizing_from_the_last_forward_converges_on_the_gap_from_below():
    """A forward of n tokens costs a + b n: the chunk converges on the n whose forward fills the gap."""
    a, b, decode = 0.03, 0.002, 0.12
    p = Pacer()
    p.decoded(decode)
    n = pacing.MIN_PREFILL_SHARE
    for _ in range(30):
        p.prefilled(n, a + b * n, beside=False)
        n = p.share(1, 4096)
    want = (p.gap() - decode - a) / b  # decode + a + b n == the gap (GAP_STEPS decode steps here)
    assert abs(n - want) <= 2
    assert decode + a + b * n <= p.gap() * 1.02


def test_a_slow_decode_step_allows_a_gap_of_a_few_of_its_steps():
    p = Pacer()
    p.decoded(0.375)
    p.prefilled(1024, 1.0, beside=False)
    assert p.gap() == pacing.GAP_STEPS * 0.375
    assert p.share(1, 4096) == int((pacing.GAP_STEPS - 1) * 0.375 * 1024)


def test_the_last_minute_figures():
    clock = Clock()
    p = Pacer(clock)
    assert p.prefill_rate() == 0.0 and p.longest_gap() == 0.0
    p.prefilled(512, 2.0)
    clock.now += 1
    p.prefilled(512, 2.0)
    assert p.prefill_rate() == pytest.approx(256.0)
    p.step_ended(decoding=True)
    clock.now += 3.5
    p.step_ended(decoding=True)
    clock.now += 0.1
    p.step_ended(decoding=True)
    assert p.longest_gap() == pytest.approx(3.5)
    p.step_ended(decoding=False)  # nothing decoded: the next decoding step starts no gap from here
    clock.now += 30
    p.step_ended(decoding=True)
    assert p.longest_gap() == pytest.approx(3.5)
    clock.now += 61
    assert p.prefill_rate() == 0.0 and p.longest_gap() == 0.0  # older than a minute: gone


def test_a_budget_given_from_outside_decides_the_share():
    """A distributed worker's rank 0 hands its budget to every rank: 0 is no prefill this step."""
    p = Pacer()
    p.decoded(0.125)
    p.prefilled(1024, 1.0, beside=False)
    assert p.share(2, 512, tokens=0) == 0
    assert p.share(2, 512, tokens=300) == 150
    assert p.share(2, 512, tokens=10) == pacing.MIN_PREFILL_SHARE
