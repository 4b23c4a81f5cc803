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


def test_the_chunk_fills_what_the_decode_share_leaves_of_a_step():
    p = Pacer()
    p.decoded(0.125)
    p.prefilled(1024, 1.0)
    assert p.share(1, 512) == 128  # 0.125 s of prefill beside a 0.125 s decode step: half the step each
    assert p.share(4, 512) == 32  # split between the prefilling rows
    assert p.share(1, 64) == 64  # never past the chunk (the snapshot interval)
    assert p.share(20, 512) == pacing.MIN_PREFILL_SHARE  # every row moves, however slow


def test_sizing_from_the_last_forward_converges_on_the_budget_from_below():
    """A forward of n tokens costs a + b n: the chunk converges on the n whose forward fills the budget."""
    a, b, decode = 0.03, 0.002, 0.12
    p = Pacer()
    p.decoded(decode)
    n = pacing.MIN_PREFILL_SHARE
    for _ in range(30):
        p.prefilled(n, a + b * n)
        n = p.share(1, 4096)
    want = (decode - a) / b  # a + b n == the budget (one decode step at DECODE_SHARE 0.5)
    assert abs(n - want) <= 2
    assert a + b * n <= decode * 1.02


def test_a_slow_decode_step_keeps_the_gap_within_max_gap():
    p = Pacer()
    p.decoded(0.375)
    p.prefilled(1024, 1.0)
    assert p.share(1, 512) == 128  # 0.125 s: 0.375 + 0.125 = MAX_GAP, not 0.375 s more
    p.decoded(2.0)
    p.decoded(2.0)
    p.decoded(2.0)
    p.decoded(2.0)
    assert 0.25 * 1.8 * 1024 <= p.share(1, 4096) <= 0.25 * 2.0 * 1024  # a quarter of a decode step where nothing fits


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
    """A distributed worker's rank 0 hands its budget to every rank: 0 (none measured) is the least share."""
    p = Pacer()
    p.decoded(0.125)
    p.prefilled(1024, 1.0)
    assert p.share(2, 512, tokens=0) == pacing.MIN_PREFILL_SHARE
    assert p.share(2, 512, tokens=300) == 150
