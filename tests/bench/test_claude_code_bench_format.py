"""`bench/scripts/claude_code_bench.py`'s pure parts: reading a turn off its stream, picking a turn's own
request, and the report's rows."""

from __future__ import annotations

import json

from devkit.scripts import load_script

_script = load_script("claude_code_bench")


def event(payload: dict) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}".encode()


def test_a_stream_gives_the_usage_at_its_start_and_the_time_of_its_first_block():
    record = {"ttft_s": None, "usage": None, "final_usage": None}
    usage = {"input_tokens": 40, "cache_read_input_tokens": 11960, "output_tokens": 0}
    _script.observe(record, b": keep-alive", 1.0)
    _script.observe(record, event({"type": "ping"}), 2.0)
    _script.observe(record, event({"type": "message_start", "message": {"usage": usage}}), 3.0)
    _script.observe(record, event({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}), 3.5)
    _script.observe(record, event({"type": "content_block_start", "index": 1, "content_block": {"type": "text"}}), 9.0)
    _script.observe(record, event({"type": "message_delta", "usage": {"output_tokens": 7}}), 9.5)
    assert record == {"ttft_s": 3.5, "usage": usage, "final_usage": {"output_tokens": 7}}


def test_a_turns_requests_are_its_full_size_ones_the_first_its_own():
    small = {"usage": {"input_tokens": 30}}
    main = {"usage": {"input_tokens": 50, "cache_read_input_tokens": 12000}}
    after = {"usage": {"input_tokens": 90, "cache_read_input_tokens": 12000}}
    assert _script.turn_requests([small, main, {"usage": None}]) == [main]
    assert _script.turn_requests([small, main, after]) == [main, after]  # its own, then the one after the result
    assert _script.turn_requests([{"usage": None}]) == []


def test_the_report_has_a_row_per_turn_with_median_and_range():
    turn = lambda ttft, read: {"ttft_s": ttft, "cache_read_input_tokens": read, "prompt_tokens": 12000}  # noqa: E731
    result = {"claude_version": "2.1.332", "loadavg_before": ["1", "2", "3"], "loadavg_after": ["2", "2", "2"],
              "rounds": [{"first": turn(100.0, 0), "first, after the tool's result": turn(3.0, 11800), "next 1": turn(4.0, 11900)},
                         {"first": turn(120.0, 0), "next 1": turn(6.0, 11950)}]}
    lines = _script.report(result)
    assert lines[2] == "| first | 12,000 | 110.00 (100.00-120.00) | 0 (0-0) | 2 |"
    assert lines[3] == "| first, after the tool's result | 12,000 | 3.00 (3.00-3.00) | 11,800 (11,800-11,800) | 1 |"
    assert lines[4] == "| next 1 | 12,000 | 5.00 (4.00-6.00) | 11,925 (11,900-11,950) | 2 |"
    assert "2.1.332" in lines[-1]


def test_the_billing_line_is_read_off_the_body_and_its_changing_fields_are_named():
    line = "x-anthropic-billing-header: cc_version=2.1.332.9a2; cc_entrypoint=sdk-cli; cch=24d9b; cc_turn_index=1;"
    other = "x-anthropic-billing-header: cc_version=2.1.332.9a2; cc_entrypoint=sdk-cli; cch=d6d52; cc_turn_index=2;"
    body = json.dumps({"system": [{"type": "text", "text": line}, {"type": "text", "text": "You are Claude Code."}]}).encode()
    assert _script.billing_of(body) == line
    assert _script.billing_of(json.dumps({"system": "plain"}).encode()) is None
    assert _script.billing_of(b"not json") is None
    assert _script.changing_fields([line, other, None]) == ["cch", "cc_turn_index"]
    assert _script.changing_fields([line, line]) == []
