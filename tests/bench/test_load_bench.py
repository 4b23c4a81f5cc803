"""`bench/scripts/load_bench.py` run as users run it, in each mode at its smallest sizes: it exits 0, every check
and promised zero holds, and the figures docs/load-bench.md, docs/hardening.md and docs/proxy.md quote are there with
values that match what was sent. About 3 minutes in all on 2 shared cores."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devkit.scripts import load_script
from mtpstack.bench.stacks import nginx_program
from tests.bench.conftest import run_bench

report = load_script("load_report")

#: The fault phases' sizes for the fake upstreams: big enough that 64 clients overflow the bounded queue.
FAKE_SIZES = {"requests": 200, "bound_requests": 100, "kills": 2, "failovers": 1, "disconnects": 16}
REAL_SIZES = {"real_requests": 8, "real_disconnects": 8, "real_kills": 1, "real_failovers": 2}
HOSTILE_SIZES = {"configs": 20, "requests": 20, "slow": 4, "agent": 12, "cut": 2, "stall-repeats": 1, "flood": 8,
                 "flood-repeats": 1}


def options(sizes: dict) -> list[str]:
    return [arg for key, n in sizes.items() for arg in (f"--{key.replace('_', '-')}", str(n))]


def run(tmp_path: Path, *args: str) -> tuple[dict, str]:
    """The script's JSON and its printed report; it exited 0 and removed its work directory."""
    report, done = run_bench("load_bench", tmp_path / "load.json", *args, timeout=900)
    workdir = re.search(r"work directory: (\S+)", done.stderr)
    assert workdir and not Path(workdir[1]).exists()
    return report, done.stdout


def assert_checks_hold(result: dict, stdout: str, count: int) -> None:
    cs = report.checks(result)
    assert [text for ok, text in cs if not ok] == [] and result["errors"] == []
    assert len(cs) == count and f"Checks: {count} of {count} hold" in stdout


def test_the_faults_on_fake_upstreams_hold_every_check(tmp_path):
    result, stdout = run(tmp_path, "--quick", "--skip-real", *options(FAKE_SIZES))
    assert_checks_hold(result, stdout, 51)  # 9 per load row, 4 + 5 + 6 for the kills, failover and disconnects
    assert result["meta"]["settings"] | FAKE_SIZES == result["meta"]["settings"]
    load, bound = result["load"][:2], result["load"][2:]
    assert [(r["gate"], r["max_waiting"]) for r in result["load"]] == [(2, 64), (4, 64), (2, 16), (4, 16)]
    for r in result["load"]:
        assert r["sent"] == r["requested"] == sum(r["statuses"].values()) and r["unanswered"] == 0
        assert sum(r["upstream_served"].values()) == r["statuses"]["200"]  # each 200 served by one upstream
        assert list(r["upstream_max_concurrency"].values()) == [r["gate"]] * 2
        assert r["streams_done"] == r["streams"] > 0
    for r in load:  # room in the queue for every client: all answered 200, every 4th one streamed
        assert r["statuses"] == {"200": FAKE_SIZES["requests"]} and r["streams"] == FAKE_SIZES["requests"] // 4
    for r in bound:  # the queue bound hit: only 429 queue_full besides 200, each with Retry-After
        assert set(r["error_codes"]) == {"429 queue_full"} and r["retry_after_missing"] == 0
    kills = result["fake_kills"]  # each round: two streams cut with the error event, the queued one a 503
    assert kills["outcomes"] == {"error_event": 2 * FAKE_SIZES["kills"], "status_503": FAKE_SIZES["kills"]}
    failover = result["fake_failover"]
    assert failover["outcomes"] == {"error_event": 1, "done": 1}
    assert failover["requests_after_failure"]["statuses"] == {"200": failover["requests_after_failure"]["sent"]}
    gone = result["fake_disconnects"]
    assert gone["proxy_logged"] == {"499": FAKE_SIZES["disconnects"]} == {"499": gone["proxy_499"]}
    assert set(gone["upstream_active_after"].values()) == {0} and gone["upstream_violations"] == 0
    assert "client disconnect" in stdout and "SIGKILL, 1 of 2 workers" in stdout


def test_the_faults_on_the_real_stack_hold_every_check(tmp_path):
    pytest.importorskip("mlx.core", reason="a real stack needs mlx (Linux: pip install 'mlx[cpu]')")
    result, stdout = run(tmp_path, "--quick", "--only", "real", "real_failover", *options(REAL_SIZES))
    assert_checks_hold(result, stdout, 22)
    assert [key for key in ("fake_kills", "fake_failover", "fake_disconnects") if key in result] == []
    (load,) = result["load"]
    assert load["target"] == "real" and load["statuses"] == {"200": REAL_SIZES["real_requests"]}
    assert load["sampled_max"]["worker_active_sequences"] <= load["gate"] and load["tokens_generated"] > 0
    kills = result["real_kills"]
    assert kills["outcomes"] == {"error_event": 2, "status_503": 1} and kills["restarts"] >= 1
    assert kills["serves_again"]["statuses"] == {"200": kills["serves_again"]["sent"]}
    gone = result["real_disconnects"]
    assert gone["proxy_logged"] == {"499": REAL_SIZES["real_disconnects"]} and not gone["worker_leaked_after"]
    assert 0 < gone["tokens_generated"] < gone["tokens_if_never_stopped"] == 400 * REAL_SIZES["real_disconnects"]
    failover = result["real_failover"]
    assert failover["kill_kinds"] == ["busy", "idle"] and failover["errors_not_taken"] == 0
    assert failover["requests"] == failover["ok"] + sum(failover["errors"].values()) and failover["ok"] > 0
    assert result["real_startup_seconds"] > 0


def test_hostile_input_at_every_phase_keeps_each_promised_zero(tmp_path):
    pytest.importorskip("mlx.core", reason="the worker phases need mlx (Linux: pip install 'mlx[cpu]')")
    result, stdout = run(tmp_path, "hostile", *options(HOSTILE_SIZES))
    zeros = report.must_be_zero(result)
    assert len(zeros) == len(report.ZEROS) + 2 and {k: n for k, n in zeros.items() if n} == {}
    v = result["validate"]
    assert v["exit_0"] + v["exit_1"] + v["exit_2"] == v["configs"] == HOSTILE_SIZES["configs"]
    for name in ("proxy", "worker"):
        m = result[name]["malformed"]
        assert m["answered"] + m["closed_without_answer"] == m["requests"] == HOSTILE_SIZES["requests"]
        assert sum(m["statuses"].values()) == m["answered"]
    slow = result["proxy"]["slow"]  # the proxy's own client deadline cuts them, long before the clients give up
    assert slow["answered_408"] + slow["closed"] == slow["slow_clients"] == HOSTILE_SIZES["slow"]
    assert slow["held_seconds_max"] < report.CLIENT_SECONDS + 5
    agent = result["agent"]
    assert agent["seeds"] == 10 and agent["cut_streams"] == HOSTILE_SIZES["cut"]
    for q in (agent["requests"], result["proxy"]["agent"]):
        assert sum(q["statuses"].values()) == q["requests"] == HOSTILE_SIZES["agent"] and q["messages"] == 4
    (flood,) = result["flood"]["arms"]["this"]
    assert sum(flood["hostile"].values()) == HOSTILE_SIZES["flood"]
    assert f"validate: {HOSTILE_SIZES['configs']} configs" in stdout and "flood: probes not answered 200: 0" in stdout


def test_the_proxy_mode_answers_every_request_on_every_target_and_cell(tmp_path):
    result, stdout = run(tmp_path, "proxy", "--rounds", "1", "--dashboard-poll")
    proxies = ["nginx", "mtpstack"] if nginx_program() else ["mtpstack"]
    assert result["proxies"] == proxies and result["meta"]["rounds"] == 1
    (rnd,) = result["rounds"]
    assert len(rnd) == 8  # plain and sse, instant and paced upstreams, 1 and 4 clients
    for key, cell in rnd.items():
        n = result["meta"]["counts"][key.rsplit("/", 1)[0]][0 if key.endswith("/1c") else 1]
        assert {t: (c["count"], c["errors"]) for t, c in cell.items()} == dict.fromkeys(["direct", *proxies], (n, 0))
    for key, cell in result["summary"].items():
        for p in proxies:
            assert cell[p]["cpu_per_request"]["median"] > 0 and cell[p]["added_p50"]["n"] == 1
            assert ("cpu_per_chunk" in cell[p] and "throughput_vs_direct" in cell[p]) == key.startswith("sse/")
        assert ("mtpstack_vs_nginx" in cell) == ("nginx" in proxies)
    poll = result["meta"]["dashboard_poll"]
    assert poll["polls"] > 0 and poll["failed"] == 0 and f"polled /v1/fleet/status {poll['polls']} times" in stdout


def test_fair_queueing_spares_the_steady_tenant_the_floods_queue(tmp_path):
    result, stdout = run(tmp_path, "tenant", "--rounds", "1", "--seconds", "3")
    (rnd,) = result["rounds"]
    assert set(rnd) == set(report.TENANT_MODES)
    for phase in rnd.values():  # one steady request a second, each found in the proxy's log by its request id
        assert len(phase["steady_latency"]) == len(phase["steady_queue_wait"]) == 3
        assert phase["steady_errors"] == phase["flood_errors"] == 0 and phase["flood_served"] > 0
    # a gate of 2 and 16 one-second streams queued: FIFO waits behind them, fair queueing takes steady next
    assert max(rnd["fair"]["steady_queue_wait"]) < min(rnd["fifo"]["steady_queue_wait"])
    assert re.search(r"^on +\d", stdout, re.M) and re.search(r"^off +\d", stdout, re.M)
