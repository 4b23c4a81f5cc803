"""`bench/scripts/load_bench.py hostile`'s report (`bench/scripts/load_report.py`): pure functions over a result."""

from devkit.scripts import load_script

_script = load_script("load_report")
must_be_zero = _script.must_be_zero
report = _script.hostile_lines


def agent_counts() -> dict:
    return {"requests": 6, "seconds": 0.5, "statuses": {200: 2, 400: 4}, "5xx": 0, "hangs": 0, "not_json": 0, "unnamed_400": 0}


def result(**over) -> dict:
    r = {
        "validate": {"configs": 10, "seconds": 0.1, "exit_0": 1, "exit_1": 4, "exit_2": 5, "tracebacks": 0, "internal_errors": 0,
                     "no_json": 0},
        "proxy": {
            "malformed": {"requests": 5, "seconds": 0.1, "statuses": {400: 5}, "closed_without_answer": 0, "5xx": 0, "hangs": 0,
                          "crashed": 0},
            "slow": {"slow_clients": 2, "answered_408": 1, "closed": 1, "held_seconds_median": 2.0, "held_seconds_max": 2.1,
                     "5xx": 0, "hangs": 0},
            "log": {"lines": 9, "not_one_json_object": 0, "with_traceback_field": 0, "internal_errors": 0, "logged_5xx": 0},
            "leaked_slots": 0,
            "crashed": 0,
            "agent": agent_counts(),
            "unrouted_not_json": 0,
        },
        "worker": {"malformed": {"requests": 5, "seconds": 0.1, "statuses": {400: 5}, "closed_without_answer": 0, "5xx": 0,
                                 "hangs": 0, "crashed": 0},
                   "leaked_slots": 0, "crashed": 0, "log_tracebacks": 0, "unrouted_not_json": 0},
        "agent": {"seeds": 10, "seeds_not_named": 0, "requests": agent_counts(), "cut_streams": 4, "leaked_slots": 0,
                  "crashed": 0, "log_errors": 0, "log_not_json": 0,
                  "stall": {"repeats": 3, "refused": 48, "idle_health_max": [0.01, 0.02, 0.16], "loaded_health_max": [0.05, 0.1, 0.27],
                            "idle_gap_max": [0.1, 0.2, 0.24], "loaded_gap_max": [0.12, 0.15, 0.17]}},
    }
    for path, value in over.items():
        *keys, last = path.split("__")
        d = r
        for k in keys:
            d = d[k]
        d[last] = value
    return r


def test_a_clean_run_has_every_promised_count_at_zero():
    assert set(must_be_zero(result()).values()) == {0}


def test_a_worker_5xx_or_a_leaked_proxy_slot_is_counted():
    counts = must_be_zero(result(worker__malformed__5xx=2, proxy__leaked_slots=1))
    assert counts["worker 5xx"] == 2 and counts["proxy leaked slots"] == 1


def test_the_report_names_each_count_and_the_slow_clients_hold_time():
    lines = report(result(validate__tracebacks=3))
    assert "validate tracebacks: 3" in "\n".join(lines)
    assert any("held 2.0 s median, 2.1 s max" in line for line in lines)


def test_agent_refusals_naming_no_field_or_not_in_openais_shape_are_counted():
    counts = must_be_zero(result(agent__requests__unnamed_400=2, agent__seeds_not_named=1, worker__unrouted_not_json=3,
                                 proxy__agent__5xx=1))
    assert counts["agent 400s naming no field"] == 3 and counts["refusals not in OpenAI's shape"] == 3
    assert counts["agent 5xx (proxy, worker)"] == 1


def test_the_report_shows_the_stall_as_median_and_range_loaded_and_idle():
    text = "\n".join(report(result()))
    assert "/health 0.10 (0.05-0.27) s at worst (idle 0.02 (0.01-0.16))" in text
    assert "largest gap 0.15 (0.12-0.17) s (idle 0.20 (0.10-0.24))" in text


def flood_round(**over) -> dict:
    probe = {"status": 200, "seconds": 0.4, "code": None}
    r = {"hostile": {"400 schema": 10, "429 busy": 108, "503 busy": 2},
         "probes": {"another client": dict(probe), "same client": dict(probe, seconds=0.9), "compiled before": dict(probe, seconds=0.1)},
         "idle_health_max": 0.02, "loaded_health_max": 0.5, "idle_gap_max": 0.1, "loaded_gap_max": 0.6, "flood_seconds": 6.0}
    r.update(over)
    return r


def flood_result(rounds: list[dict]) -> dict:
    return {"seed": 1, "flood": {"hostile": 120, "repeats": len(rounds), "against": None, "arms": {"this": rounds}}}


def test_a_flood_phase_alone_reports_its_own_zeros_only():
    counts = must_be_zero(flood_result([flood_round(), flood_round()]))
    assert counts == {"flood: probes not answered 200": 0, "flood: answers but a fuel 400 or worker_busy": 0}


def test_a_benign_probe_refused_or_a_400_blaming_the_compile_deadline_is_counted():
    busy = {"status": 503, "seconds": 5.1, "code": "worker_busy"}
    bad = flood_round(hostile={"400 schema": 2, "400 deadline": 7, "429 busy": 111})
    bad["probes"]["another client"] = busy
    counts = must_be_zero(flood_result([flood_round(), bad]))
    assert counts == {"flood: probes not answered 200": 1, "flood: answers but a fuel 400 or worker_busy": 7}
    text = "\n".join(report(flood_result([flood_round(), bad])))
    assert "another client: 1 x 200, 1 x 503 worker_busy, answered in 2.75 (0.40-5.10) s" in text
    assert "400 deadline 4 (0-7)" in text and "/health at worst 0.50 (0.50-0.50) s (idle 0.02 (0.02-0.02))" in text


def test_what_a_flooded_request_got_is_told_apart_by_status_code_and_message():
    kind = _script.flood_answer_kind
    assert kind(400, {"param": "response_format", "message": "`response_format` cannot be enforced: too big"}) == "400 schema"
    assert kind(400, {"param": "response_format", "message": "... it did not compile within 5 s"}) == "400 deadline"
    assert kind(429, {"code": "worker_busy"}) == "429 busy" and kind(503, {"code": "worker_busy"}) == "503 busy"
    assert kind(503, {"code": "loading"}) == "503 other" and kind(None, {}) == "None other"
