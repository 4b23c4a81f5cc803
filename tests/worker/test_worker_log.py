"""The worker's log is JSON lines (`mtpstack.logs`) from its first line to its last, and SIGTERM ends
it with exit code 0, whatever the model family imports or leaves running."""

from __future__ import annotations

import json

import pytest

from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

pytestmark = pytest.mark.mlx

#: Start-serve-stop cycles: the abort at exit this guards against (mlx used from the generation
#: thread, ml-explore/mlx#3126) struck about a third of stops, so five cycles miss it about 1 in 6.
CYCLES = 5


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_a_hybrid_worker_logs_only_json_lines_and_stops_with_code_0(live_worker, monkeypatch):
    # transformers prints a text advisory (no PyTorch) through its own handler when it is imported
    # before mlx-lm, whose import silences it by setting this variable; this test process imported
    # mlx-lm already, so the worker gets the environment a user's shell has.
    monkeypatch.delenv("TRANSFORMERS_NO_ADVISORY_WARNINGS", raising=False)
    for _ in range(CYCLES):
        with live_worker(DEMO_TARGET, DEMO_HEAD, width=1) as w:
            status, _, _ = w.post_json("/v1/completions", {"model": "tiny", "prompt": "def f(", "max_tokens": 4})
            assert status == 200
        assert w.proc.exit_code == 0
        lines = w.proc.log_path.read_text().splitlines()
        assert lines and [line for line in lines if not is_json_object(line)] == []
