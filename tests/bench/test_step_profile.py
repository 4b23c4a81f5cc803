"""The step profile's bookkeeping: nested parts counted once, the gaps between parts named, step cost paired by round."""

from __future__ import annotations

import pytest

from devkit.scripts import load_script

sp = load_script("step_profile")


class Clock:
    """A clock the test advances by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_nested_part_is_taken_out_of_the_part_that_contains_it():
    clock = Clock()
    t = sp.Timeline(clock)
    t.enter("verify")
    clock.now = 1.0
    t.enter("recurrence")
    clock.now = 1.5
    t.leave("recurrence")
    clock.now = 3.0
    t.leave("verify")
    assert t.totals == {"verify": 2.5, "recurrence": 0.5}
    assert t.spans == [("verify", 0.0, 3.0)]  # only the outermost part is a span of the step


def test_sampling_is_the_gap_between_the_lm_head_and_the_commit_and_other_is_what_nothing_timed_covers():
    clock = Clock()
    t = sp.Timeline(clock)
    for part, start, end in [("draft", 0.0, 1.0), ("verify", 1.0, 5.0), ("lm head", 5.0, 6.0), ("commit", 6.5, 7.0),
                             ("commit", 7.0, 7.25), ("head replay", 7.25, 8.0)]:
        clock.now = start
        t.enter(part)
        clock.now = end
        t.leave(part)
    parts = sp.step_parts(t, total=8.5)
    assert parts["sample+accept"] == 0.5
    assert parts["commit"] == 0.75
    assert parts["other"] == pytest.approx(8.5 - 8.0)  # the timed parts and the gap cover 8.0 of 8.5
    assert set(parts) == set(sp.PARTS)


def test_a_plain_step_has_no_draft_and_no_replay():
    clock = Clock()
    t = sp.Timeline(clock)
    for part, start, end in [("verify", 0.0, 2.0), ("lm head", 2.0, 2.5), ("commit", 3.0, 3.5)]:
        clock.now = start
        t.enter(part)
        clock.now = end
        t.leave(part)
    parts = sp.step_parts(t, total=4.0)
    assert parts["draft"] == parts["head replay"] == 0.0
    assert parts["sample+accept"] == 0.5 and parts["other"] == 0.5


def test_step_cost_is_paired_within_each_round():
    rounds = [{0: [1.0, 1.0, 1.2], 3: [1.5, 1.5]}, {0: [2.0], 3: [2.6]}, {3: [9.0]}]  # the third has no plain step
    assert sp.step_cost_rounds(rounds, 3) == [1.5, 1.3]
    assert sp.step_cost_rounds(rounds, 0) == [1.0, 1.0]
    assert sp.spread([1.5, 1.3, 1.4]) == "1.40 (1.30-1.50)"
    assert sp.spread([]) == "n/a"


def report(cost: float, verify_ms: float) -> dict:
    row = {"depth": 3, "tokens_per_step": 2.5, "parts": {p: {"build_ms": 0.0, "eval_ms": verify_ms if p == "verify" else 0.0}
                                                           for p in sp.PARTS}}
    for key, value in (("step_ms", 0.1), ("step_cost", cost), ("cpu_cost", cost), ("floor_cost", 1.2), ("forced_ms", 0.1)):
        row[key + "_raw"] = [value]
    return {"command": "x", "repeats": 1, "steps": 4, "loadavg": ["1.0", "2.0"],
            "pairs": [{"name": "demo", "models": "m", "widths": [{"width": 1, "depths": [row]}]}]}


def test_single_round_reports_merge_into_one_with_every_round_and_the_parts_medians():
    merged = sp.merge([report(1.5, 10.0), report(1.3, 20.0), report(1.4, 90.0)])
    row = merged["pairs"][0]["widths"][0]["depths"][0]
    assert row["step_cost_raw"] == [1.5, 1.3, 1.4] and row["step_cost"] == "1.40 (1.30-1.50)"
    assert row["parts"]["verify"]["eval_ms"] == 20.0
    assert merged["repeats"] == 3 and "step cost" in "\n".join(sp.table(merged))


def test_reports_of_different_configurations_are_not_merged():
    other = report(1.0, 1.0)
    other["pairs"][0]["widths"][0]["depths"][0]["depth"] = 2
    with pytest.raises(ValueError, match="same configurations"):
        sp.merge([report(1.5, 10.0), other])
