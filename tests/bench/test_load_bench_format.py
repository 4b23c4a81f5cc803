"""The load bench's pure parts (`bench/scripts/load_report.py`): the table, the checks and the report lines; and
the Prometheus parsing it shares with `mtpstack bench` (`mtpstack.proxy.prometheus`)."""

from __future__ import annotations

import copy

import pytest

from devkit.scripts import load_script
from mtpstack.proxy.prometheus import parse_samples, sample

_script = load_script("load_report")
checks = _script.checks
fault_lines = _script.fault_lines
load_lines = _script.load_lines
report_lines = _script.report_lines
table = _script.table

METRICS = """# HELP mtpstack_proxy_inflight Requests admitted.
# TYPE mtpstack_proxy_inflight gauge
mtpstack_proxy_inflight{worker="u0"} 2.0
mtpstack_proxy_inflight{worker="u1"} 0.0
mtpstack_proxy_requests_total{model="fake",status="200"} 19990.0
mtpstack_worker_active_sequences 1.0
"""


def fake_load(**over) -> dict:
    r = {
        "label": "fake-gate2-waiting64", "target": "fake", "gate": 2, "upstreams": 2, "clients": 64, "max_waiting": 64,
        "capacity": 68, "queue_bound_reachable": False, "requested": 100, "complete": True, "sent": 100, "answered": 100,
        "unanswered": 0, "unanswered_reasons": {}, "statuses": {"200": 100}, "error_codes": {}, "retry_after_missing": 0,
        "retry_after_values": {}, "streams": 25, "streams_done": 25, "stream_errors": 0, "stream_truncated": 0,
        "seconds": 1.0, "requests_per_second": 100.0, "latency_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0},
        "upstream_max_concurrency": {"u0": 2, "u1": 2}, "upstream_violations": 0, "upstream_served": {"u0": 50, "u1": 50},
        "sampled_max": {"inflight{worker=u0}": 2.0, "inflight{worker=u1}": 2.0, "queue_depth{model=fake}": 60.0},
        "samples": 10, "inflight_after": 0.0, "proxy_rss_kib": {"before": 50000, "after": 51200, "peak": 52000},
    }
    r.update(over)
    return r


def kills(**over) -> dict:
    r = {
        "target": "fake", "requested": 3, "kills": 3, "clients": 9, "hung": 0, "rounds_with_leaked_slot": 0,
        "admitted_streams_cut_without_error_event": 0, "outcomes": {"error_event": 6, "status_503": 3},
        "kills_with_fewer_than_2_streams_started": 0, "slots_after": {"inflight": 0.0, "queue_depth": 0.0}, "leaked_after": False,
    }
    r.update(over)
    return r


def disconnects(**over) -> dict:
    r = {
        "target": "fake", "requested": 4, "disconnects": 4, "kinds": {"mid-stream/fin": 3, "early/rst": 1}, "hung": 0,
        "connection_errors": 0, "slots_after": {"inflight": 0.0, "queue_depth": 0.0}, "leaked_after": False, "proxy_499": 4,
        "proxy_logged": {"499": 4}, "proxy_logged_by_kind": {"mid-stream/fin": {"499": 3}, "early/rst": {"499": 1}},
        "upstream_active_after": {"d0": 0}, "upstream_cancelled": 4, "upstream_violations": 0,
        "serves_again": {"sent": 2, "statuses": {"200": 2}, "streams_done": 2, "unanswered": 0},
    }
    r.update(over)
    return r


def failover(**over) -> dict:
    r = kills(requested=2, kills=2, clients=4, outcomes={"error_event": 2, "done": 2}, survivor_streams_done=2,
              requests_after_failure={"sent": 8, "statuses": {"200": 8}, "unanswered": 0, "error_codes": {}})
    r.update(over)
    return r


def result(**over) -> dict:
    r = {
        "meta": {"finished": "2026-11-29T15:00:00Z", "command": "bench/scripts/load_bench.py --quick", "cpus": 2,
                 "machine": "x86_64", "commit": "abc1234", "seconds": 60},
        "load": [fake_load()], "fake_kills": kills(), "fake_failover": failover(), "fake_disconnects": disconnects(), "errors": [],
    }
    r.update(over)
    return r


def failed(r: dict) -> list[str]:
    return [text for ok, text in checks(r) if not ok]


def test_parse_metrics_reads_labelled_and_bare_samples_and_skips_comments():
    m = parse_samples(METRICS)
    assert sample(m, "mtpstack_proxy_inflight", worker="u0") == 2.0
    assert sample(m, "mtpstack_proxy_requests_total", status="200", model="fake") == 19990.0
    assert sample(m, "mtpstack_worker_active_sequences") == 1.0
    assert sample(m, "mtpstack_proxy_inflight", worker="u9") is None
    assert "# HELP" not in "".join(m)


def test_table_aligns_columns_and_shows_none_as_a_dash():
    lines = table(["a", "bbb"], [["long value", None], [1, 2]])
    assert lines[0].index("bbb") == lines[1].index("-") == lines[2].index("2")
    assert all(line == line.rstrip() for line in lines)


def test_a_clean_result_passes_every_check():
    assert failed(result()) == []


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda r: r["load"][0].update(upstream_max_concurrency={"u0": 3, "u1": 2}), "equals the gate 2: [3, 2]"),
        (lambda r: r["load"][0].update(upstream_max_concurrency={"u0": 1, "u1": 2}), "equals the gate 2: [1, 2]"),
        (lambda r: r["load"][0].update(unanswered=1), "requests unanswered: 1"),
        (lambda r: r["load"][0].update(error_codes={"429 queue_full": 5}), "429 queue_full while the queue had room for every client: 5"),
        (lambda r: r["load"][0].update(error_codes={"429 worker_full": 1}), "answers other than 200 and 429 queue_full"),
        (lambda r: r["load"][0]["sampled_max"].update({"inflight{worker=u0}": 3.0}), "proxy inflight never above the gate"),
        (lambda r: r["load"][0].update(stream_truncated=1), "streams ending without [DONE]: 1"),
        (lambda r: r["fake_kills"].update(hung=1), "hung clients: 1"),
        (lambda r: r["fake_kills"].update(rounds_with_leaked_slot=2), "leaked slots: 2 rounds"),
        (lambda r: r["fake_kills"].update(admitted_streams_cut_without_error_event=1), "streams cut without an error event: 1"),
        (lambda r: r["fake_kills"].update(kills=2), "kills done before the deadline: 2"),
        (lambda r: r["fake_failover"].update(outcomes={"error_event": 3, "done": 1}), "the one on the survivor with [DONE]"),
        (lambda r: r["fake_failover"]["requests_after_failure"].update(statuses={"200": 7, "502": 1}, error_codes={"502 upstream_unreachable": 1}),
         "answered 200 (by the survivor): 7 of 8 {'502 upstream_unreachable': 1}"),
        (lambda r: r["fake_disconnects"].update(leaked_after=True, slots_after={"inflight": 1.0, "queue_depth": 0.0}), "leaked proxy slots after settling"),
        (lambda r: r["fake_disconnects"].update(upstream_active_after={"d0": 1}), "still active in the upstreams after settling: 1"),
        (lambda r: r["fake_disconnects"]["serves_again"].update(statuses={"200": 1, "503": 1}), "serves again"),
        (lambda r: r["fake_disconnects"].update(proxy_logged={"499": 3, "500": 1}), "logged with a status other than 499: {'500': 1}"),
        (lambda r: r["fake_disconnects"].update(proxy_logged={"499": 3, "not logged": 1}), "other than 499: {'not logged': 1}"),
    ],
)
def test_each_broken_property_fails_its_check(change, needle):
    r = copy.deepcopy(result())
    change(r)
    fails = failed(r)
    assert len(fails) == 1 and needle in fails[0], fails


def test_a_reachable_queue_bound_must_show_429s_with_retry_after():
    bound = fake_load(max_waiting=16, queue_bound_reachable=True, error_codes={"429 queue_full": 40}, retry_after_values={"1": 40})
    assert failed(result(load=[bound])) == []
    assert failed(result(load=[dict(bound, error_codes={})]))  # the bound was reachable but never hit
    assert failed(result(load=[dict(bound, retry_after_missing=1)]))


def test_real_rows_check_the_worker_side_gauges():
    real = fake_load(target="real", upstreams=1, clients=16, max_waiting=32, worker_full_rejections=0,
                     sampled_max={"proxy_inflight{worker=w0}": 2.0, "worker_active_sequences": 2.0})
    assert failed(result(load=[real])) == []
    fails = failed(result(load=[dict(real, worker_full_rejections=3)]))
    assert len(fails) == 1 and "worker_full 429s from the worker: 3" in fails[0]
    assert "2 (sampled)" in load_lines([real])[1]


def test_report_marks_failures_and_unfinished_phases():
    lines = report_lines(result(fake_kills=kills(hung=2), errors=["real stack: RuntimeError: boom"]))
    text = "\n".join(lines)
    assert "FAIL  fake worker kills (3 of 3): hung clients: 2" in text
    assert "FAIL  phase did not finish: real stack: RuntimeError: boom" in text
    assert lines[1] == "command: bench/scripts/load_bench.py --quick"


def test_fault_lines_have_one_row_per_fault_kind_present():
    lines = fault_lines(result())
    assert len(lines) == 4
    assert "6 error_event, 3 status_503" in lines[1]
    assert lines[2].rstrip().endswith("then 8 x 200 of 8")
    assert "client disconnect" in lines[3] and lines[3].rstrip().endswith("4 x 499")


KILL = 1_000.0  # the wall-clock second `w0` was killed


def logged(worker: str, sent: float, ended: float, failed_over=None) -> dict:
    return {"worker": worker, "sent": sent, "ended": ended, "failed_over": failed_over, "code": None}


def test_an_error_counts_as_taken_by_the_dead_worker_only_when_it_was_sent_there_before_the_kill_and_ended_after():
    failover_counts = _script.failover_counts
    outcomes = {"in-flight": "stream upstream_disconnected", "after": "502 upstream_unreachable", "saved": "ok",
                "survivor": "ok", "elsewhere": "stream upstream_disconnected", "unlogged": "ServerDisconnectedError"}
    lines = {"in-flight": logged("w0", KILL - 0.3, KILL + 0.01),
             "after": logged("w0", KILL + 0.2, KILL + 0.21),  # sent to it once dead: the fault issue 40 removes
             "saved": logged("w1", KILL + 0.2, KILL + 0.5, ["w0"]),
             "survivor": logged("w1", KILL - 1, KILL + 1),
             "elsewhere": logged("w1", KILL - 0.5, KILL + 0.1)}
    counts = failover_counts(outcomes, lines, [KILL], "w0")
    assert (counts["requests"], counts["ok"], counts["failed_over"]) == (6, 2, 1)
    assert (counts["errors_taken_by_dead"], counts["errors_not_taken"]) == (1, 3)
    assert sorted(counts["errors_not_taken_ids"]) == ["after", "elsewhere", "unlogged"]


def test_the_failover_check_fails_on_an_error_the_dead_worker_had_not_taken():
    base = {"target": "real", "requested": 2, "kills": 2, "clients": 16, "requests": 100, "ok": 99, "failed_over": 3,
            "errors_taken_by_dead": 1, "errors_not_taken": 0, "errors": {"stream upstream_disconnected": 1}, "errors_not_taken_ids": []}
    assert all(passed for passed, _ in checks({"load": [], "real_failover": base}))
    failed = [text for passed, text in checks({"load": [], "real_failover": {**base, "errors_not_taken": 1}}) if not passed]
    assert failed == ["real failover under load (2 of 2 kills): errors for requests the dead worker had not taken: 1"]
    lines = "\n".join(fault_lines({"real_failover": base}))
    assert "99 ok of 100; 3 sent on to the survivor" in lines and "1 taken by the dead worker, 0 not" in lines
