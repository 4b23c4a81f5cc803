"""`mtpstack up` refusing, failing clearly, and stopping cleanly."""

from __future__ import annotations

import socket
import subprocess
import sys

import yaml

from tests.e2e.conftest import Stack, alive, fleet, wait_until


def up(config: dict, tmp_path, timeout: float = 120) -> subprocess.CompletedProcess:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "mtpstack", "up", str(path), "--run-dir", str(tmp_path / "run"), "--health-timeout", "60"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_an_invalid_fleet_is_refused_with_the_validators_message(tiny_pair, tmp_path):
    config = fleet(*tiny_pair, width=2)
    config["proxy"]["modelConcurrencyLimits"]["tiny"] = 4
    result = up(config, tmp_path)
    assert result.returncode == 1
    assert "error[concurrency-mismatch]" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


def test_a_worker_that_cannot_load_is_named_with_its_log_tail(tiny_pair, tmp_path):
    target, drafter = tiny_pair
    config = fleet(tmp_path / "no-such-model", drafter, width=1)
    result = up(config, tmp_path)
    assert result.returncode == 1
    assert "worker `w0` exited" in result.stderr
    assert "log tail" in result.stderr and "no-such-model" in result.stderr
    assert "Traceback" not in result.stderr.split("log tail")[0]


def test_the_log_tail_of_a_worker_that_fails_to_load_is_plain_text(tiny_pair, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "nope"}')  # found, listened, then not loadable
    result = up(fleet(broken, tiny_pair[1], width=1), tmp_path)
    assert result.returncode == 1
    tail = result.stderr.split("log tail", 1)[1]
    # The worker logged JSON lines (`mtpstack.logs`); `up` shows them as a person reads them.
    assert "\nlistening on http://" in tail and "\nerror: the worker failed to load its models: " in tail
    assert '"event"' not in tail


def test_a_busy_port_is_named_before_anything_starts(tiny_pair, tmp_path):
    config = fleet(*tiny_pair, width=1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", config["workers"]["w0"]["port"]))
        busy.listen()
        result = up(config, tmp_path)
    assert result.returncode == 1
    assert f"port {config['workers']['w0']['port']}" in result.stderr and "`w0`" in result.stderr
    assert "hint: " in result.stderr


def test_sigterm_stops_the_proxy_then_the_workers_and_leaves_no_process(tiny_pair, tmp_path):
    s = Stack(tmp_path, fleet(*tiny_pair, width=2, workers=2))
    try:
        s.wait_ready()
        pids = s.pids()
        assert len(pids) == 3 and all(alive(p) for p in pids)
        wait_until(lambda: "curl -s" in (tmp_path / "up.out").read_text(), 10, "the ready banner")
    finally:
        code = s.stop()
    assert code == 0
    for pid in pids:
        wait_until(lambda: not alive(pid), 15, f"process {pid} to be gone")
    assert s.state()["phase"] == "stopped"
    log = s.err_path.read_text()
    assert log.index("stopping: proxy first") < log.index("stopped")
