"""`bench/scripts/validator_bench.py`, run for real on small fleets of every kind."""

from __future__ import annotations

from tests.bench.conftest import run_bench


def test_every_kind_of_fleet_is_timed_and_written(tmp_path):
    report, done = run_bench("validator_bench", tmp_path / "validate.json", "--workers", "10", "20", "--repeats", "2",
                             "--kind", "valid", "rules", "structure")
    fleets = report["fleets"]
    kinds = ("valid", "rules", "structure")
    assert [(f["workers"], f["kind"]) for f in fleets] == [(n, k) for n in (10, 20) for k in kinds]
    assert all(len(f["seconds"]) == 2 and f["bytes"] > 0 for f in fleets)
    assert "structure" in done.stderr and " s (" in done.stderr
