"""Anthropic's Messages API on a real worker: Claude Code's shapes, the stream's events, forced tools
under speculation, thinking, count_tokens, the prefix cache's reuse in usage, and refusals in
Anthropic's error shape. The tiny agent model thinks by default and its weights are random."""

from __future__ import annotations

import json
import urllib.request

import pytest

from devkit.demo.agent import build_agent_pair
from mtpstack.worker.protocol.messages import reasoning_of
from tests.anthropic_stream import replay

HTTP_TIMEOUT = 60
WEATHER = {"name": "get_weather", "description": "The weather in a city.", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
    "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
#: Claude Code 2.1's request, as recorded (`../shared/notes/anthropic-clients.md`), its texts shortened.
CLAUDE_CODE = {
    "model": "tiny", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code."},
               {"type": "text", "text": "You are an interactive CLI tool.", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "list the files"}]},
                 {"role": "system", "content": [{"type": "text", "text": "<context>cwd: /tmp</context>",
                                                 "cache_control": {"type": "ephemeral"}}]}],
    "tools": [WEATHER, {"name": "Bash", "description": "Runs a command.", "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}],
    "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s-1"})},
    "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
}
HEADERS = {"Content-Type": "application/json", "anthropic-version": "2023-06-01",
           "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,frobnicate-2099-01-01"}


@pytest.fixture(scope="module")
def worker(tmp_path_factory, live_worker_class):
    pair = build_agent_pair(tmp_path_factory.mktemp("agent"), seed=0)
    with live_worker_class(tmp_path_factory.mktemp("messagesw"), *pair, depth=2, width=2) as w:
        yield w


def post(worker, body: dict, path: str = "/v1/messages?beta=true") -> tuple[int, dict, bytes]:
    req = urllib.request.Request(worker.url + path, data=json.dumps(body).encode(), headers=HEADERS)
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def message(worker, **body) -> dict:
    status, _, data = post(worker, {"model": "tiny", "temperature": 0, **body})
    assert status == 200, data
    return json.loads(data)


def events(data: bytes) -> list[dict]:
    """The stream's events, each checked to be named as its `type`."""
    out = []
    for block in data.decode().split("\n\n"):
        lines = block.strip().splitlines()
        if not lines or all(line.startswith(":") for line in lines):
            continue
        name = next(line[len("event: "):] for line in lines if line.startswith("event: "))
        payload = json.loads(next(line[len("data: "):] for line in lines if line.startswith("data: ")))
        assert payload["type"] == name, block
        out.append(payload)
    return out



def streamed(worker, **body) -> tuple[list[dict], dict]:
    status, headers, data = post(worker, {"model": "tiny", "temperature": 0, "stream": True, **body})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream"), data
    evs = events(data)
    return evs, replay(evs)


def test_claude_codes_first_turn_streams_the_events_it_expects(worker):
    status, _, data = post(worker, {**CLAUDE_CODE, "max_tokens": 32000, "temperature": 0})
    assert status == 200, data
    evs = events(data)
    kinds = [e["type"] for e in evs]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    start = evs[0]["message"]
    assert start["id"].startswith("msg_") and start["role"] == "assistant" and start["content"] == []
    assert start["model"] == "tiny" and start["usage"]["input_tokens"] > 0
    msg = replay(evs)
    assert msg["stop_reason"] in ("end_turn", "max_tokens", "tool_use") and msg["content"]
    # thinking is on (adaptive) but not displayed: the block comes without its text, its signature carries it
    thinking = [b for b in msg["content"] if b["type"] == "thinking"]
    assert thinking and all(b["thinking"] == "" and reasoning_of(b["signature"]) for b in thinking)


def test_a_message_has_anthropics_shape_and_counts_its_tokens(worker):
    msg = message(worker, messages=ASK, max_tokens=8, thinking={"type": "disabled"})
    assert msg["type"] == "message" and msg["id"].startswith("msg_") and msg["stop_sequence"] is None
    assert [b["type"] for b in msg["content"]] == ["text"] and msg["stop_reason"] in ("end_turn", "max_tokens")
    u = msg["usage"]
    assert set(u) == {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}
    assert 0 < u["output_tokens"] <= 8
    status, _, data = post(worker, {"model": "tiny", "messages": ASK, "thinking": {"type": "disabled"}},
                           "/v1/messages/count_tokens?beta=true")
    assert status == 200, data
    assert json.loads(data) == {"input_tokens": u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]}


def test_the_stream_replays_to_the_message_answered_whole(worker):
    body = dict(messages=ASK, max_tokens=24, thinking={"type": "enabled", "budget_tokens": 6}, tools=[WEATHER])
    whole = message(worker, **body)
    _, replayed = streamed(worker, **body)
    strip = lambda m: [{k: v for k, v in b.items() if k != "id"} for b in m["content"]]  # noqa: E731
    assert strip(replayed) == strip(whole) and replayed["stop_reason"] == whole["stop_reason"]
    assert whole["content"][0]["type"] == "thinking" and whole["content"][0]["thinking"]
    assert reasoning_of(whole["content"][0]["signature"]) == whole["content"][0]["thinking"]


@pytest.mark.parametrize("depth", [0, 2])
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_a_forced_tool_yields_input_valid_against_its_schema_with_and_without_speculation(worker, depth, choice):
    evs, msg = streamed(worker, messages=ASK, max_tokens=96, tools=[WEATHER, CLAUDE_CODE["tools"][1]], tool_choice=choice,
                        num_draft_tokens=depth)
    calls = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert msg["stop_reason"] == "tool_use" and len(calls) == 1, msg
    call = calls[0]
    assert call["id"].startswith("toolu_") and (choice["type"] == "any" or call["name"] == "get_weather")
    if call["name"] == "get_weather":
        assert "city" in call["input"] and set(call["input"]) <= {"city", "days"}
        assert isinstance(call["input"]["city"], str) and len(call["input"]["city"]) <= 12
        assert isinstance(call["input"].get("days", 0), int)
    else:
        assert set(call["input"]) == {"command"} and isinstance(call["input"]["command"], str)
    assert any(e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta" for e in evs)


def test_a_tool_round_trip_with_thinking_in_the_history_is_served(worker):
    first = message(worker, messages=ASK, max_tokens=96, tools=[WEATHER], tool_choice={"type": "any"},
                    thinking={"type": "adaptive", "display": "omitted"})
    call = next(b for b in first["content"] if b["type"] == "tool_use")
    history = ASK + [{"role": "assistant", "content": first["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny",
                                                   "is_error": False, "cache_control": {"type": "ephemeral"}}]}]
    again = message(worker, messages=history, max_tokens=8, tools=[WEATHER])
    assert again["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    # the next turn resumes from the prompt the first one prefilled
    assert again["usage"]["cache_read_input_tokens"] > 0, again["usage"]


def test_a_stop_sequence_ends_the_message_and_is_named(worker):
    free = message(worker, messages=ASK, max_tokens=30, thinking={"type": "disabled"}, ignore_eos=True)
    text = free["content"][0]["text"]
    stop = text[6:9]
    cut = message(worker, messages=ASK, max_tokens=30, thinking={"type": "disabled"}, ignore_eos=True, stop_sequences=[stop])
    assert cut["content"][0]["text"] == text[: text.find(stop)]
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("stop_sequence", stop)


def test_max_tokens_reached_is_the_max_tokens_stop_reason(worker):
    msg = message(worker, messages=ASK, max_tokens=3, thinking={"type": "disabled"}, ignore_eos=True)
    assert msg["stop_reason"] == "max_tokens" and msg["usage"]["output_tokens"] == 3


@pytest.mark.parametrize("body, status, error_type, named", [
    ({"messages": [{"role": "robot", "content": "x"}], "max_tokens": 4}, 400, "invalid_request_error", "messages[0].role"),
    ({"messages": ASK, "max_tokens": 4, "tools": [{"name": "f"}]}, 400, "invalid_request_error", "tools[0].input_schema"),
    ({"messages": ASK, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ({"messages": ASK, "max_tokens": 4, "temperature": "hot"}, 400, "invalid_request_error", "temperature"),
    ({"messages": ASK, "max_tokens": 4, "tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, 400,
     "invalid_request_error", "nope"),
    ({"messages": [{"role": "user", "content": " ".join(map(str, range(6000)))}], "max_tokens": 4}, 400,
     "invalid_request_error", "prompt"),
    ({"messages": ASK, "max_tokens": 4, "model": "claude-opus-4"}, 404, "not_found_error", "claude-opus-4"),
])
def test_refusals_are_in_anthropics_error_shape_and_name_the_field(worker, body, status, error_type, named):
    got, _, data = post(worker, {"model": "tiny", **body})
    payload = json.loads(data)
    assert got == status and payload["type"] == "error" and payload["error"]["type"] == error_type, payload
    assert named in payload["error"]["message"]


def test_unknown_fields_are_ignored_and_logged_once(worker):
    for _ in range(2):
        message(worker, messages=ASK, max_tokens=2, frobnicate_v9=1, container="c", service_tier="auto")
    log = worker.proc.log_path.read_text()
    assert log.count("field `frobnicate_v9` is accepted and ignored") == 1
    assert "field `container`" not in log


def test_claude_codes_first_party_billing_line_does_not_break_the_cached_prefix(worker):
    """In its first-party mode Claude Code's first system block changes on every request (`cch=`,
    `cc_prompt_id=`, `cc_turn_index=`, ...); the worker reads it without those fields, so the next
    request of the conversation reuses the whole prompt the first one prefilled."""
    from tests.protocol.test_messages import BILLING_FIRST_PARTY

    def body(line: str, messages: list) -> dict:
        return {"model": "tiny", "temperature": 0, "max_tokens": 4, "thinking": {"type": "disabled"},
                "system": [{"type": "text", "text": line}, *CLAUDE_CODE["system"]], "messages": messages,
                "tools": CLAUDE_CODE["tools"]}

    first = message(worker, **body(BILLING_FIRST_PARTY[0], CLAUDE_CODE["messages"]))
    history = CLAUDE_CODE["messages"] + [{"role": "assistant", "content": first["content"]},
                                         {"role": "user", "content": "and the tests?"}]
    again = message(worker, **body(BILLING_FIRST_PARTY[1], history))
    first_prompt = sum(first["usage"][k] for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    assert again["usage"]["cache_read_input_tokens"] >= 0.95 * first_prompt, (first["usage"], again["usage"])
    # a field the line keeps (its version) does change what the model reads: nothing of the prefix is shared
    other = BILLING_FIRST_PARTY[1].replace("cc_version=2.1.332.9a2", "cc_version=2.1.333.9a2")
    control = message(worker, **body(other, history))
    assert control["usage"]["cache_read_input_tokens"] < 0.1 * first_prompt, control["usage"]
