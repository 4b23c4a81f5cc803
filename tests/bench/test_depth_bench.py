"""The adaptive-depth bench: its summary's arithmetic, and one real run of every configuration on a tiny
widened demo target with the weak head (fresh worker processes, weights proven from their argv)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devkit.scripts import load_script

depth_bench = load_script("depth_bench")


def _pass(tps: float, steps: dict | None = None, outputs=("a", "b")) -> dict:
    return {"tps": tps, "acceptance": None, "steps_by_depth": steps or {}, "outputs": list(outputs)}


def test_auto_is_set_against_the_best_fixed_depth_and_depth_0_with_the_depths_it_ran():
    passes = {
        "0": {"code@1": [_pass(10.0), _pass(12.0)]},
        "2": {"code@1": [_pass(20.0), _pass(18.0), _pass(22.0)]},
        "auto": {"code@1": [_pass(19.0, {"2": 30.0, "0": 10.0}), _pass(21.0, {"2": 50.0, "1": 10.0})]},
    }
    row = depth_bench.summarize(passes, [0, 2])["code@1"]
    assert row["best_fixed"] == 2 and row["tps"]["2"] == {"median": 20.0, "min": 18.0, "max": 22.0, "n": 3}
    assert row["auto_over_best"] == pytest.approx(1.0) and row["auto_over_depth0"] == pytest.approx(20.0 / 11.0)
    assert row["auto_depths"] == {"0": 0.1, "1": 0.1, "2": 0.8} and row["auto_mean_depth"] == pytest.approx(1.7)
    assert row["same_output"] is True
    passes["2"]["code@1"][0]["outputs"] = ["a", "c"]  # one configuration answered another text: lossless broken
    assert depth_bench.summarize(passes, [0, 2])["code@1"]["same_output"] is False


def test_one_round_of_every_configuration_reports_and_plots(tmp_path):
    cmd = [sys.executable, "bench/scripts/depth_bench.py", "--out", str(tmp_path), "--pairs", "weak-head", "--depths", "0,2",
           "--widths", "1,2", "--workloads", "tool", "prose", "--rounds", "1", "--prompts", "2", "--max-tokens", "12",
           "--mlp-multiplier", "1", "--extra-layers", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    summary = results["summary"]["weak-head"]
    assert sorted(summary) == ["prose@1", "prose@2", "tool@1", "tool@2"]
    for key, row in summary.items():
        assert set(row["tps"]) == {"0", "2", "auto"} and all(c["median"] > 0 for c in row["tps"].values()), key
        assert row["same_output"], key  # greedy text is the target's at every depth, auto included
        assert abs(sum(row["auto_depths"].values()) - 1) < 1e-9 and set(row["auto_depths"]) <= {"0", "1", "2"}, key
    # A fixed depth ran at that depth only (a row near its max_tokens may draft less, never more).
    for key, passes in results["passes"]["weak-head"]["2"].items():
        assert {int(d) for p in passes for d in p["steps_by_depth"]} <= {0, 1, 2}, key
    report = (tmp_path / "report.md").read_text()
    assert "## weak-head" in report and "| tool@2 |" in report
    assert (tmp_path / "depth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
