"""Paired passes: the rule on pairs, the drift model, the measured neighbour correlation, and
`mtpstack bench simulate --design paired` as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mtpstack.bench import simulate as sim
from mtpstack.bench.stats import MIN_PAIRS, decide, decide_batch, neighbour_correlation


def test_pairing_cancels_drift_that_blocks_hide_it_in():
    # A 20% win under a drift that moves every pair: per-side medians overlap, pair ratios do not.
    drift = [1.0, 1.6, 0.7, 1.3, 0.9, 1.5, 0.8, 1.2, 1.1, 0.75]
    base = [100 * d for d in drift]
    cand = [120 * d * (1.0 + 0.01 * (-1) ** i) for i, d in enumerate(drift)]
    assert decide(base, cand, paired=True).adopt
    assert not decide(base, cand).adopt


@pytest.mark.parametrize("paired", [True, False])
def test_the_simulation_extends_only_what_the_sweep_extends_never_a_change_that_looks_slower(paired):
    # `Verdict.open` (the sweep's) chases no change whose estimate is a loss, however wide its interval.
    rng = np.random.default_rng(3)
    base = rng.lognormal(0.0, 0.14, (400, 10))
    cand = base * rng.lognormal(0.0, 0.15, (400, 10)) * rng.choice([0.99, 1.03, 1.08], (400, 1))
    adopt, still_open, ratio = decide_batch(base, cand, paired=paired, resamples=300, rng=np.random.default_rng(0))
    slower = [i for i in range(400) if ratio[i] <= 1.0 and decide(base[i], cand[i], paired=paired).hi > 1.05]
    assert slower and still_open.any()  # rows a straddling-only rule would chase, and rows still open
    assert not still_open[slower].any() and not (still_open & adopt).any()


def test_the_paired_rule_refuses_too_few_pairs_and_unequal_sides():
    assert decide([1.0] * (MIN_PAIRS - 1), [2.0] * (MIN_PAIRS - 1), paired=True).decision == "too few passes"
    with pytest.raises(ValueError):
        decide([1.0] * 5, [1.0] * 6, paired=True)


def test_drifting_runs_keep_the_cv_and_correlate_neighbours_by_rho():
    runs = sim.drifting_runs(np.random.default_rng(1), 400, 60, cv=0.14, rho=0.5)
    logs = np.log(runs)
    assert np.std(logs) == pytest.approx(sim.lognormal_sigma(0.14), rel=0.05)
    z = logs - logs.mean(axis=1, keepdims=True)
    lag1 = float(np.mean(z[:, 1:] * z[:, :-1]) / np.mean(z * z))
    assert lag1 == pytest.approx(0.5, abs=0.05)


def test_neighbour_correlation_recovers_a_known_drift_and_ignores_the_configurations_own_levels():
    rng = np.random.default_rng(2)
    series = sim.drifting_runs(rng, 1, 4000, cv=0.1, rho=0.6)[0]
    labels = ["a", "b"] * 2000
    values = [v * (1.5 if lab == "b" else 1.0) for v, lab in zip(series, labels)]
    assert neighbour_correlation(labels, values) == pytest.approx(0.6, abs=0.05)
    assert neighbour_correlation(["a", "b"], [1.0, 2.0]) is None


def test_resident_processes_bias_a_pair_and_a_fresh_process_per_run_does_not():
    common = dict(repeats=(20,), setup=sim.Setup(cv=0.05, trials=300, resamples=300), start=20, cap=20, rho=0.5, process_cv=0.1)
    resident = sim.simulate_paired(resident=True, **common)[0]
    fresh = sim.simulate_paired(resident=False, **common)[0]
    # A constant offset between two processes is read as a difference; redrawn per run it averages out.
    assert resident.false_adopt > 0.1 > fresh.false_adopt


def test_simulate_paired_prints_false_adopt_and_power_per_number_of_passes_as_json():
    run = subprocess.run(
        [sys.executable, "-m", "mtpstack", "bench", "simulate", "--design", "paired", "--repeats", "5,10,30",
         "--trials", "200", "--resamples", "200", "--format", "json"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["design"] == "paired" and out["settings"]["rho"] == sim.DEFAULT_RHO
    assert [p["n"] for p in out["passes"]] == [5, 10, 30]
    for p in out["passes"]:
        assert set(p) == {"n", "false_adopt", "power", "sequential"} and 0 <= p["false_adopt"] <= 0.05
    assert out["passes"][-1]["sequential"]["power"] >= 0.8
    assert out["passes"][0]["sequential"] == {"false_adopt": None, "power": None}  # below the sequential start


@pytest.mark.mlx
def test_alternate_runs_two_depths_and_a_depth_map_against_fixed_depths_in_one_worker(tiny_pair, tmp_path):
    from mtpstack.bench.sweep import start_worker
    from mtpstack.runtime import free_port
    from mtpstack.validator import WorkerProfile

    target, drafter = tiny_pair
    profile = WorkerProfile.model_validate(
        {"model": "tiny", "target": {"path": str(target), "bits": "fp32"}, "maxNumSeqs": 1, "port": free_port(),
         "drafter": {"path": str(drafter), "bits": "fp32", "depth": {"code": 4, "prose": 1, "default": 3}}})
    proc = start_worker(profile, tmp_path / "worker.log", "tiny")
    try:
        proc.wait_ready("/health", 120, state="healthy")
        for mode, arms in ((["--depths", "0,3", "--pairs", "5"], ["depth 0", "depth 3"]),
                           (["--map", "--fixed", "1,4", "--passes", "5"], ["fixed 1", "fixed 4", "map"])):
            out = tmp_path / "runs.json"
            done = subprocess.run([sys.executable, "bench/scripts/alternate.py", "--url", proc.url, "--max-tokens", "8",
                                   "--out", str(out), *mode], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            runs = json.loads(out.read_text())
            assert sorted(runs["arms"]) == arms and len(runs["runs"]) == 5 * len(arms) and runs["identical_text"]
            # Pass by pass every arm once, the order rotating: what `bench simulate --rho-from` reads.
            assert [r["config"] for r in runs["runs"][: len(arms)]] == arms
            assert [r["config"] for r in runs["runs"][len(arms): 2 * len(arms)]] == [*arms[1:], arms[0]]
            assert any(" / " in line and "->" in line for line in runs["summary"])
    finally:
        proc.stop()
