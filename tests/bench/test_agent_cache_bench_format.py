"""The agent benchmark's summaries and table are pure functions of its raw samples; its `claude_code`
scenario reads a turn off its stream, picks a turn's own request and makes a row per turn."""

from __future__ import annotations

import json

import pytest

from devkit.scripts import load_script

agent_bench = load_script("agent_bench")


def samples(turns, shared, conc, itl=()):
    return {"turns": turns, "shared": shared, "concurrent": conc, "prefill_itl": list(itl)}


def test_turns_after_the_first_are_summarized_apart_and_against_their_own_first_turn():
    s = agent_bench.summarize_samples({"native+mtp": samples([[10.0, 1.0, 2.0], [20.0, 2.0, 2.0]], [(1.0, 10.0)], [3.0])})
    v = s["native+mtp"]
    assert v["turn1_ttft_s"]["median"] == 15.0 and v["later_ttft_s"]["median"] == 2.0 and v["later_ttft_s"]["n"] == 4
    assert v["later_over_turn1"]["min"] == pytest.approx(0.1) and v["later_over_turn1"]["max"] == pytest.approx(0.15)
    assert [t["median"] for t in v["per_turn_ttft_s"]] == [15.0, 1.5, 2.0]
    assert v["shared_over_first"]["median"] == pytest.approx(0.1)


def test_the_itl_window_keeps_only_gaps_that_end_while_the_long_prompt_is_prefilled():
    times = [0.0, 0.1, 0.2, 1.2, 2.2, 2.3, 2.4]
    w = agent_bench.itl_windows(times, [(0.15, 2.25)])
    assert w["n"] == 3 and w["median_s"] == pytest.approx(1.0) and w["p99_s"] == pytest.approx(1.0)
    assert w["outside_median_s"] == pytest.approx(0.1)
    assert agent_bench.itl_windows(times, [(5.0, 6.0)])["n"] == 0


def test_gaps_inside_several_windows_count_as_inside_and_the_restore_table_names_each_build():
    times = [0.0, 0.1, 0.2, 0.6, 0.7, 0.8, 1.3, 1.4]
    w = agent_bench.itl_windows(times, [(0.15, 0.65), (1.0, 1.35)])
    assert w["n"] == 3 and w["max_s"] == pytest.approx(0.5) and w["outside_median_s"] == pytest.approx(0.1)
    rounds = [{"this checkout": {**w, "disk_hits": 4, "read_mb": 25.0, "restore_s": 0.05},
               "baseline": {**w, "max_s": 0.9, "disk_hits": 4, "read_mb": 25.0, "restore_s": 0.08}}]
    summary = agent_bench.restore_summary(rounds)
    assert summary["baseline"]["max_s"]["median"] == 0.9 and summary["this checkout"]["inside_over_outside"]["median"] == pytest.approx(4.0)
    text = "\n".join(agent_bench.format_lines({"summary": {"restore_itl": summary}, "rounds": 1, "warmup": 0}))
    assert "beside a restore from disk, baseline (25.0 MB (25.0-25.0, n=1) a restore" in text and "max 0.900 s" in text


def test_the_table_names_both_servers_and_their_ratio():
    summary = agent_bench.summarize_samples({
        "native+mtp": samples([[1.0, 0.1]], [(0.1, 1.0)], [0.5], [{"median_s": 0.2, "p99_s": 0.3, "outside_median_s": 0.01}]),
        "mlx_lm.server": samples([[1.0, 0.2]], [(0.2, 1.0)], [0.5]),
    })
    lines = agent_bench.format_lines({"summary": summary, "rounds": 1, "warmup": 0, "prompt_tokens": "900-1200"})
    text = "\n".join(lines)
    assert "turns 2+ TTFT: native+mtp / mlx_lm.server = 0.50x" in text
    assert "p99/median 1.50x" in text and "900-1200 tokens" in lines[0]


def test_a_restart_is_summarized_against_the_cold_prefill_with_the_restores_throughput():
    rounds = [{"restart_ttft_s": 0.5, "cold_ttft_s": 10.0, "read_bytes": 2e9, "restore_s": 1.0, "prompt_tokens": 3000, "cached_tokens": 2990},
              {"restart_ttft_s": 1.0, "cold_ttft_s": 10.0, "read_bytes": 2e9, "restore_s": 0.5, "prompt_tokens": 3000, "cached_tokens": 2990}]
    r = agent_bench.restart_summary(rounds)
    assert r["restart_over_cold"]["median"] == pytest.approx(0.075) and r["restore_gb_s"]["max"] == pytest.approx(4.0)
    lines = agent_bench.format_lines({"summary": {"restart": r}, "rounds": 2, "warmup": 0})
    assert any("0.075x" in line and "GB/s" in line for line in lines)


def test_the_memory_flood_is_the_resident_growth_against_what_the_cache_counts():
    flood = {"build": "b", "idle_rss_mib": 100.0, "after": [{"rss_mib": 200.0, "hwm_mib": 210.0, "gauge_mib": 25.0},
                                                            {"rss_mib": 300.0, "hwm_mib": 310.0, "gauge_mib": 50.0}]}
    m = agent_bench.memory_summary([flood])["b"]
    assert m["rss_growth_mib"] == [100.0, 200.0] and m["growth_over_gauge"] == 4.0
    assert m["growth_per_prompt_mib"]["median"] == 100.0


def test_the_turns_with_thinking_on_and_off_are_summarized_apart():
    s = agent_bench.summarize_samples({"native+mtp": {**samples([[1.0, 0.1]], [], []), "turns_by_thinking": {"on": [[2.0, 0.2, 0.4]]}}})
    assert s["native+mtp"]["thinking"]["on"]["later_over_turn1"]["median"] == pytest.approx(0.15)


def test_the_spilling_flood_compares_the_rows_p99_with_and_without_the_disk_tier():
    window = lambda p99: {"median_s": 0.1, "p99_s": p99, "n": 9, "disk_writes": 0.0, "evictions": 3.0}  # noqa: E731
    s = agent_bench.spill_summary([{"memory": window(0.4), "disk": window(0.5)}, {"memory": window(0.5), "disk": window(0.5)}])
    assert s["p99_disk_over_memory"]["median"] == pytest.approx(1.125) and s["memory"]["p99_s"]["n"] == 2
    assert any("1.12x" in line or "1.13x" in line for line in agent_bench.format_lines({"summary": {"spill_itl": s}, "rounds": 2, "warmup": 0}))


# -- `claude_code` ------------------------------------------------------------------------


def event(payload: dict) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}".encode()


def test_a_stream_gives_the_usage_at_its_start_and_the_time_of_its_first_block():
    record = {"ttft_s": None, "usage": None, "final_usage": None}
    usage = {"input_tokens": 40, "cache_read_input_tokens": 11960, "output_tokens": 0}
    agent_bench.observe(record, b": keep-alive", 1.0)
    agent_bench.observe(record, event({"type": "ping"}), 2.0)
    agent_bench.observe(record, event({"type": "message_start", "message": {"usage": usage}}), 3.0)
    agent_bench.observe(record, event({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}), 3.5)
    agent_bench.observe(record, event({"type": "content_block_start", "index": 1, "content_block": {"type": "text"}}), 9.0)
    agent_bench.observe(record, event({"type": "message_delta", "usage": {"output_tokens": 7}}), 9.5)
    assert record == {"ttft_s": 3.5, "usage": usage, "final_usage": {"output_tokens": 7}}


def test_a_turns_requests_are_its_full_size_ones_the_first_its_own():
    small = {"usage": {"input_tokens": 30}}
    main = {"usage": {"input_tokens": 50, "cache_read_input_tokens": 12000}}
    after = {"usage": {"input_tokens": 90, "cache_read_input_tokens": 12000}}
    assert agent_bench.turn_requests([small, main, {"usage": None}]) == [main]
    assert agent_bench.turn_requests([small, main, after]) == [main, after]  # its own, then the one after the result
    assert agent_bench.turn_requests([{"usage": None}]) == []


def test_the_report_has_a_row_per_turn_with_median_and_range():
    turn = lambda ttft, read: {"ttft_s": ttft, "cache_read_input_tokens": read, "prompt_tokens": 12000}  # noqa: E731
    result = {"claude_version": "2.1.332", "loadavg_before": ["1", "2", "3"], "loadavg_after": ["2", "2", "2"],
              "rounds": [{"first": turn(100.0, 0), "first, after the tool's result": turn(3.0, 11800), "next 1": turn(4.0, 11900)},
                         {"first": turn(120.0, 0), "next 1": turn(6.0, 11950)}]}
    lines = agent_bench.claude_lines(result)
    assert lines[2] == "| first | 12,000 | 110.00 (100.00-120.00) | 0 (0-0) | 2 |"
    assert lines[3] == "| first, after the tool's result | 12,000 | 3.00 (3.00-3.00) | 11,800 (11,800-11,800) | 1 |"
    assert lines[4] == "| next 1 | 12,000 | 5.00 (4.00-6.00) | 11,925 (11,900-11,950) | 2 |"
    assert "2.1.332" in lines[-1]


def test_the_billing_line_is_read_off_the_body_and_its_changing_fields_are_named():
    line = "x-anthropic-billing-header: cc_version=2.1.332.9a2; cc_entrypoint=sdk-cli; cch=24d9b; cc_turn_index=1;"
    other = "x-anthropic-billing-header: cc_version=2.1.332.9a2; cc_entrypoint=sdk-cli; cch=d6d52; cc_turn_index=2;"
    body = json.dumps({"system": [{"type": "text", "text": line}, {"type": "text", "text": "You are Claude Code."}]}).encode()
    assert agent_bench.billing_of(body) == line
    assert agent_bench.billing_of(json.dumps({"system": "plain"}).encode()) is None
    assert agent_bench.billing_of(b"not json") is None
    assert agent_bench.changing_fields([line, other, None]) == ["cch", "cc_turn_index"]
    assert agent_bench.changing_fields([line, line]) == []
