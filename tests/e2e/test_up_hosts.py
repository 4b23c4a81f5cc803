"""`mtpstack up --host` over loopback: two runs of one placed fleet, each starting its host's
parts; the proxy dials the other run's worker at its host's address, and `mtpstack status`
shows every part, probing the remote one over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.e2e.conftest import Stack, alive, fleet, get_json, wait_until


def placed_fleet(tiny_pair) -> dict:
    config = fleet(*tiny_pair, width=1, workers=2)
    # Both "hosts" are this machine, reached at loopback: `there` runs w0, `here` runs w1 and the proxy.
    config["hosts"] = {"here": {"address": "127.0.0.1"}, "there": {"address": "127.0.0.1"}}
    config["proxy"]["deployOn"] = "here"
    config["workers"]["w0"].update(deployOn="there", host="0.0.0.0")
    config["workers"]["w1"]["deployOn"] = "here"
    return config


def test_each_host_runs_its_own_parts_and_the_proxy_reaches_the_other_hosts_worker(tiny_pair, tmp_path):
    config = placed_fleet(tiny_pair)
    (tmp_path / "there").mkdir()
    (tmp_path / "here").mkdir()
    there = Stack(tmp_path / "there", config, ["--host", "there"])
    here = Stack(tmp_path / "here", config, ["--host", "here"])
    pids: list[int] = []
    try:
        here.wait_ready()  # /readyz: both workers healthy, w0 dialled at `there`'s address
        wait_until(lambda: "host `there` is up: worker `w0`" in (tmp_path / "there" / "up.out").read_text(), 30, "there's banner")
        pids = here.pids() + there.pids()
        here_state, there_state = here.state(), there.state()
        assert here_state["workers"]["w1"]["pid"] and here_state["proxy"]["pid"]
        assert here_state["workers"]["w0"] == {"kind": "worker", "remote": True, "model": "tiny", "host": "there",
                                               "url": f"http://127.0.0.1:{config['workers']['w0']['port']}"}  # fmt: skip
        assert set(there_state["workers"]) == {"w0", "w1"} and there_state["workers"]["w1"]["remote"]
        assert there_state["proxy"]["remote"] and len(there.pids()) == 1
        # /readyz turns 200 with one healthy worker per model; w0, loading on the other run, may follow.
        def both_healthy():
            _, ready = get_json(here.proxy_url + "/readyz")
            return {n: w["healthy"] for n, w in ready.get("workers", {}).items()} == {"w0": True, "w1": True}

        wait_until(both_healthy, 60, "the proxy to see both workers healthy, w0 at `there`'s address")

        proc = subprocess.run([sys.executable, "-m", "mtpstack", "status", "--run-dir", str(here.run_dir), "--format", "json"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        status = json.loads(proc.stdout)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (status["workers"]["w0"]["host"], status["workers"]["w0"]["health"]) == ("there", 200)
        assert status["workers"]["w0"]["weights"]["target"] == config["workers"]["w0"]["target"]["path"]
        assert status["workers"]["w1"]["weights"]["proved"]
    finally:
        here.stop()
        there.stop()
    for pid in pids:
        wait_until(lambda: not alive(pid), 15, f"process {pid} to be gone")


def test_a_host_name_not_declared_is_refused_with_did_you_mean(tiny_pair, tmp_path):
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(placed_fleet(tiny_pair)))
    proc = subprocess.run([sys.executable, "-m", "mtpstack", "up", str(path), "--host", "ther", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    assert "error: no host `ther` is declared under `hosts` (declared: `here`, `there`)" in proc.stderr
    assert "hint: did you mean `--host there`?" in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()
