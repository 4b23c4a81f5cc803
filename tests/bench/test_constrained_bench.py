"""The constrained-decoding bench, run for real: one round of every configuration on the shipped demo pair."""

from __future__ import annotations

import json
import subprocess
import sys

from devkit.scripts import load_script

constrained_bench = load_script("constrained_bench")


def test_one_round_of_every_configuration_reports_speed_and_acceptance(tmp_path):
    out = tmp_path / "constrained.json"
    cmd = [sys.executable, "bench/scripts/constrained_bench.py", "--rounds", "1", "--tokens", "12", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert list(report["configs"]) == list(constrained_bench.CONFIGS)
    for name, (drafter, _) in constrained_bench.CONFIGS.items():
        (run,) = report["raw"][name]  # the warm-up round is discarded
        assert 0 < run["tokens"] <= 12 and report["configs"][name]["tok_s"]["median"] > 0, name
        assert (run["drafted"] > 0) == drafter, name
    assert "drafter+schema" in done.stderr
