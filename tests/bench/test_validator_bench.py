"""`bench/scripts/validator_bench.py`, run for real on small fleets of every kind."""

from __future__ import annotations

import json
import subprocess
import sys


def test_every_kind_of_fleet_is_timed_and_written(tmp_path):
    out = tmp_path / "validate.json"
    cmd = [sys.executable, "bench/scripts/validator_bench.py", "--workers", "10", "20", "--repeats", "2",
           "--kind", "valid", "rules", "structure", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    fleets = json.loads(out.read_text())["fleets"]
    kinds = ("valid", "rules", "structure")
    assert [(f["workers"], f["kind"]) for f in fleets] == [(n, k) for n in (10, 20) for k in kinds]
    assert all(len(f["seconds"]) == 2 and f["bytes"] > 0 for f in fleets)
    assert "structure" in done.stderr and " s (" in done.stderr
