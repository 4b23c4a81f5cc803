"""The step profile's bookkeeping: nested parts counted once, the gaps between parts named, step cost paired by
round; and two real rounds on the demo pair."""

from __future__ import annotations

import pytest

from devkit.scripts import load_script
from tests.bench.conftest import run_bench

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


def test_on_paper_at_27b_dimensions_the_recurrence_run_once_moves_a_fifth_of_the_state_it_moved_at_depth_3():
    p = sp.paper_step(sp.MODEL_DIMS["qwen3.5-27b"], depth=3)
    state = 48 * 128 * 128 * 4  # a gated-delta layer's state, one row: 3 MiB
    assert state == 3 * 2**20
    assert p["before"]["state_bytes"] == 48 * (4 * 2 + 2) * state  # four launches each reading and writing it, a copy
    assert p["after_all_kept"]["state_bytes"] == p["plain"]["state_bytes"] == 48 * 2 * state
    assert p["after_rejected"]["state_bytes"] == 2 * p["plain"]["state_bytes"]
    assert p["before"]["launches"] == 48 * 14 and p["after_all_kept"]["launches"] == p["plain"]["launches"]
    # the target: ~27B parameters at 4.5 bits; the head: its ~0.42B at 6.5 bits and the 1.27B LM head, three times
    assert 14.0e9 < p["target_bytes"] < 15.0e9
    one = sp.paper_step(sp.MODEL_DIMS["qwen3.5-27b"], depth=1)
    assert p["head_bytes"] == 3 * one["head_bytes"] and 1.0e9 < one["head_bytes"] < 1.1e9


def test_two_rounds_on_the_demo_pair_time_every_part_and_pair_the_costs_by_round(tmp_path):
    report, done = run_bench("step_profile", tmp_path / "profile.json", "--pairs", "demo", "--depths", "1", "--widths",
                             "1", "--repeats", "2", "--steps", "1", "--mlp-multiplier", "1", "--extra-layers", "0")
    (width,) = report["pairs"][0]["widths"]
    plain, drafted = width["depths"]
    assert report["repeats"] == 2 and plain["step_cost_raw"] == [1.0, 1.0] and len(drafted["step_cost_raw"]) == 2
    # the forced step's parts were timed where they run: the target's recurrence, the head's accept step
    assert drafted["parts"]["recurrence"]["eval_ms"] > 0 and drafted["parts"]["head replay"]["eval_ms"] > 0
    assert plain["parts"]["head replay"]["eval_ms"] == 0 and drafted["tokens_per_step"] >= 1
    assert "step cost" in done.stderr
