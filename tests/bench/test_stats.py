"""The statistics and the decision rule (pure, fast)."""

from __future__ import annotations

import numpy as np
import pytest

from mtpstack.bench import simulate, stats
from mtpstack.bench.stats import Candidate, decide, settling, summarize


def test_summary_reports_median_mad_and_range():
    s = summarize([20.0, 22.0, 23.0, 27.0, 17.0])
    assert (s.n, s.median, s.min, s.max) == (5, 22.0, 17.0, 27.0)
    # deviations from 22: 2, 0, 1, 5, 5 -> median 2
    assert s.mad == 2.0
    assert s.rel_mad == pytest.approx(2 / 22)


def test_summary_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        summarize([])


def test_ratio_interval_brackets_the_ratio_of_medians():
    base = [10.0, 10.5, 9.8, 10.2, 10.1]
    cand = [12.0, 12.4, 11.9, 12.2, 12.1]
    ratio, lo, hi = stats.ratio_ci(base, cand)
    assert ratio == pytest.approx(12.1 / 10.1)
    assert lo <= ratio <= hi
    assert lo > 1.1


def test_ratio_interval_is_reproducible_with_a_fixed_seed():
    rng = np.random.default_rng(3)
    base, cand = rng.normal(20, 2, 8), rng.normal(21, 2, 8)
    assert stats.ratio_ci(base, cand, seed=7) == stats.ratio_ci(base, cand, seed=7)


def test_a_clear_win_is_adopted():
    v = decide([10.0, 10.1, 9.9, 10.0], [13.0, 13.1, 12.9, 13.0])
    assert v.decision == "adopt" and v.adopt


def test_a_win_smaller_than_the_margin_is_not_adopted_however_tight():
    v = decide([10.0, 10.01, 9.99, 10.0, 10.0], [10.3, 10.31, 10.29, 10.3, 10.3], margin=0.05)
    assert v.decision == "not significant"
    assert v.ratio == pytest.approx(1.03)


def test_an_interval_straddling_the_threshold_is_open_only_for_an_apparent_win():
    noisy_win = decide([10, 12, 8, 11, 9], [12, 14, 9, 13, 10])
    assert noisy_win.decision == "not significant" and noisy_win.open
    noisy_loss = decide([12, 14, 9, 13, 10], [10, 12, 8, 11, 9])
    assert not noisy_loss.open


@pytest.mark.parametrize("nb,nc", [(2, 5), (5, 2), (1, 1), (0, 3)])
def test_fewer_than_three_passes_per_side_gives_no_ratio(nb, nc):
    v = decide([10.0] * nb, [20.0] * nc)
    assert v.decision == "too few passes"
    assert v.ratio is None and v.lo is None and not v.adopt


def test_recommend_keeps_the_baseline_when_nothing_is_adopted():
    base = Candidate("no-drafter", None, (10.0, 10.5, 9.5, 10.2))
    cands = [Candidate("depth 1", 1, (10.1, 10.4, 9.6, 10.0)), Candidate("depth 2", 2, (10.3, 10.0, 9.9, 10.6))]
    assert settling(base, cands).recommended is base


def test_recommend_picks_the_smallest_depth_within_noise_of_the_best():
    base = Candidate("no-drafter", None, (10.0, 10.1, 9.9, 10.0, 10.05))
    d1 = Candidate("depth 1", 1, (12.0, 12.1, 11.9, 12.0, 12.05))  # adopted, but credibly behind the best
    d2 = Candidate("depth 2", 2, (13.8, 14.1, 13.6, 14.0, 13.7))  # within noise of the best
    d3 = Candidate("depth 3", 3, (14.0, 14.6, 13.5, 14.2, 13.9))  # the best median
    assert settling(base, [d3, d1, d2]).recommended is d2
    assert settling(base, [d3, d1]).recommended is d3


def test_recommend_refuses_with_too_few_passes():
    base = Candidate("no-drafter", None, (10.0, 10.1))
    assert settling(base, [Candidate("depth 1", 1, (20.0, 20.0, 20.0))]) is None


def test_false_adopt_rate_on_null_data_stays_within_five_percent():
    rows = simulate.simulate((3, 4, 5, 8), simulate.Setup(effect=0.15, trials=300, resamples=300), seed=1)
    for row in rows:
        assert row.rule_false_adopt is not None
        assert row.rule_false_adopt <= simulate.FALSE_ADOPT_LIMIT, row
    # the naive rule on the same data is fooled far more often: the comparison means something
    assert max(r.naive_false_adopt for r in rows) > 0.15


def test_the_sweeps_adaptive_procedure_also_stays_within_five_percent():
    row = simulate.simulate_adaptive(3, 8, simulate.Setup(trials=200, resamples=300), seed=2)
    assert row.false_adopt <= simulate.FALSE_ADOPT_LIMIT
    assert row.detect > row.false_adopt


def test_detection_grows_with_repeats_at_low_noise():
    rows = simulate.simulate((3, 10), simulate.Setup(cv=0.05, trials=200, resamples=300), seed=4)
    assert rows[1].rule_detect > rows[0].rule_detect
    assert simulate.repeats_needed(rows, 0.8) == 10


def test_the_rule_refuses_below_three_passes_in_the_table():
    rows = simulate.simulate((1,), simulate.Setup(trials=50, resamples=50))
    assert rows[0].rule_false_adopt is None
    assert "refuses" in simulate.format_table(rows)[2]


def test_power_estimate_refuses_a_win_below_the_margin():
    with pytest.raises(ValueError):
        simulate.repeats_for_power(effect=0.04, margin=0.05)
    assert simulate.repeats_for_power(cv=0.05) < simulate.repeats_for_power(cv=0.14)


def test_default_noise_matches_the_measured_spread():
    lines = simulate.format_report([], cv=simulate.DEFAULT_CV, effect=0.15, margin=0.05, trials=1, seed=0)
    lo, hi = (float(x) for x in lines[0].rsplit(" ", 1)[1].rstrip(")").split("-"))
    assert 17.0 <= lo <= 18.0 and 27.0 <= hi <= 28.0  # measured: 17.4-27.3 around 22


def test_settling_names_the_comparison_the_recommendation_rests_on():
    base = Candidate("no-drafter", None, (20.0, 21.0, 22.0, 23.0, 24.0))
    d1 = Candidate("depth 1", 1, (30.0, 30.5, 31.0, 31.5, 32.0))
    d2 = Candidate("depth 2", 2, (29.0, 31.0, 33.0, 35.0, 37.0))
    s = settling(base, [d1, d2])
    assert (s.recommended, s.best) == (d1, d2) and s.verdict is not None and not s.decided
    alone = settling(base, [d1])
    assert alone.recommended is alone.best is d1 and alone.verdict is None and alone.decided
    assert settling(base, [Candidate("depth 3", 3, (1.0, 2.0))]) is None


def test_percentile_is_a_measured_value_by_nearest_rank():
    from mtpstack.bench.stats import percentile

    v = [float(i) for i in range(1, 21)]
    assert percentile(v, 95) == 19.0 and percentile(v, 50) == 10.0 and percentile([7.0], 95) == 7.0
    assert percentile([], 50) != percentile([], 50)  # NaN


def test_a_clustered_bootstrap_is_wider_than_one_that_treats_correlated_values_as_independent():
    from mtpstack.bench.stats import cluster_ratio_ci, median

    rng = np.random.default_rng(1)
    # 8 sessions a side, each with its own level (shared load, a cache), 10 turns each
    base = [list(rng.lognormal(np.log(level), 0.05, 10)) for level in rng.lognormal(0, 0.5, 8)]
    cand = [list(rng.lognormal(np.log(level), 0.05, 10)) for level in rng.lognormal(np.log(1.5), 0.5, 8)]
    ratio, lo, hi = cluster_ratio_ci(base, cand, median, resamples=500)
    flat_ratio, flat_lo, flat_hi = cluster_ratio_ci([[v] for c in base for v in c], [[v] for c in cand for v in c], median, resamples=500)
    assert ratio == flat_ratio and lo <= ratio <= hi
    assert hi - lo > 1.3 * (flat_hi - flat_lo)


def test_a_clustered_bootstrap_of_identical_sides_straddles_one_and_drops_empty_clusters():
    from mtpstack.bench.stats import cluster_ratio_ci, median

    side = [[1.0, 2.0], [3.0], [], [2.5, 0.5]]
    ratio, lo, hi = cluster_ratio_ci(side, side, median, resamples=300)
    assert ratio == 1.0 and lo < 1.0 < hi
    with pytest.raises(ValueError):
        cluster_ratio_ci([[]], side, median)
