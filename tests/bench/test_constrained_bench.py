"""The constrained-decoding bench, run for real: one round of every configuration on the shipped demo pair."""

from __future__ import annotations

from devkit.scripts import load_script
from tests.bench.conftest import run_bench

constrained_bench = load_script("constrained_bench")


def test_one_round_of_every_configuration_reports_speed_and_acceptance(tmp_path):
    report, done = run_bench("constrained_bench", tmp_path / "constrained.json", "--rounds", "1", "--tokens", "12")
    assert list(report["configs"]) == list(constrained_bench.CONFIGS)
    for name, (drafter, _) in constrained_bench.CONFIGS.items():
        (run,) = report["raw"][name]  # the warm-up round is discarded
        assert 0 < run["tokens"] <= 12 and report["configs"][name]["tok_s"]["median"] > 0, name
        assert (run["drafted"] > 0) == drafter, name
    assert "drafter+schema" in done.stderr
