"""A real worker on the agent tokenizer against hostile input on the agent surfaces (tools,
`tool_choice`, Responses items, JSON schemas): never a 5xx, every refusal a 400 in OpenAI's shape
naming its field, no traceback for a client that leaves mid-stream, and compiling a hostile schema
delays neither `/health` nor another request's tokens."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from devkit.demo.agent import build_agent_pair
from devkit.hostile import AGENT_SEEDS, random_agent_request, seed_request
from devkit.raw_http import RawStream, json_answer
from devkit.stall import concurrently, measure

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}
#: Streams cut in the middle: the issue saw a traceback for 12 of 40.
CUT_STREAMS = 24
FUZZ_SEED, FUZZ_COUNT = 23, 120
#: Hostile schemas sent while the stall is measured, this many at a time.
STALL_SCHEMAS, STALL_WIDTH = 16, 8
#: What "not delayed noticeably" allows while they compile, in seconds: the proxy's health
#: timeout is 3 s; before issue 23 these compiles held the loop (and `/health`) for several.
HEALTH_BOUND = GAP_BOUND = 1.0


@pytest.fixture(scope="module")
def worker(tmp_path_factory, live_worker_class):
    pair = build_agent_pair(tmp_path_factory.mktemp("agent-hostile"), seed=0)
    with live_worker_class(tmp_path_factory.mktemp("agent-hostile-w"), *pair, depth=2, width=2) as w:
        yield w


def _cut_stream_body(i: int) -> tuple[str, dict]:
    """The three agent answer paths: a Responses stream, a chat stream that may call a tool, a forced call."""
    if i % 3 == 0:
        return "/v1/responses", {"input": "Say something long", "stream": True, "max_output_tokens": 400, **NO_THINK}
    body = {"messages": [{"role": "user", "content": "Weather?"}], "stream": True, "max_tokens": 400, "tools": [WEATHER],
            "ignore_eos": True, **NO_THINK}
    return "/v1/chat/completions", {**body, "tool_choice": "required"} if i % 3 == 2 else body


async def test_clients_leaving_agent_streams_leave_no_traceback_and_no_slot(worker):
    port = int(worker.url.rsplit(":", 1)[1])
    for i in range(CUT_STREAMS):
        path, body = _cut_stream_body(i)
        stream = await RawStream.open("127.0.0.1", port, body, request_id=f"cut-{i}", path=path)
        assert await stream.headers() == 200
        await stream.until_events(2)
        stream.close("rst" if i % 2 else "fin")
        await asyncio.sleep(0.02 * (i % 4))  # leave at different points of the writer's turn
    for _ in range(100):  # each cancelled sequence frees its slot within a step
        if worker.get_json("/health")["active"] == 0:
            break
        await asyncio.sleep(0.05)
    assert worker.get_json("/health") == {"max_num_seqs": 2, "active": 0, "status": "ok"}
    entries = [json.loads(line) for line in worker.proc.log_path.read_text().splitlines()]
    assert not [e for e in entries if e.get("level") == "error" or "traceback" in e], entries[-5:]


@pytest.mark.parametrize("name", sorted(AGENT_SEEDS))
def test_each_shape_that_answered_500_or_was_served_is_a_400_naming_its_field(worker, name):
    path, body, param = seed_request(name, "tiny")
    status, headers, payload = json_answer(worker.url + path, "POST", {"Content-Type": "application/json"}, body)
    assert (status, payload["error"]["param"], payload["error"]["type"]) == (400, param, "invalid_request_error"), payload
    assert headers["X-Request-Id"]


def test_generated_hostile_agent_requests_get_no_5xx_and_each_400_names_a_field(worker):
    rng = random.Random(FUZZ_SEED)
    statuses: dict[int, int] = {}
    for _ in range(FUZZ_COUNT):
        path, body = random_agent_request(rng, "tiny")
        status, _, payload = json_answer(worker.url + path, "POST", {"Content-Type": "application/json"}, body, timeout=60)
        statuses[status] = statuses.get(status, 0) + 1
        assert status in (200, 400), (status, payload, body[:300])
        if status == 400:
            error = payload["error"]
            assert error["param"] and error["message"] and error["type"] == "invalid_request_error", (error, body[:300])
    assert statuses.get(400, 0) > FUZZ_COUNT // 2, statuses  # the generator is hostile, not merely odd


def slow_schema(i: int) -> dict:
    """Integer ranges llguidance's lexer works on for ~0.1 s before its fuel runs out (then a 400);
    distinct per `i`, so none comes from the cache of compiled grammars."""
    return {"anyOf": [{"type": "integer", "minimum": -j * (123_457 + i) - 17, "maximum": j * (987_654 + i) + 523}
                      for j in range(700)]}


def test_compiling_hostile_schemas_delays_neither_health_nor_a_plain_stream(worker):
    def send(i: int) -> int:
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **NO_THINK,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": slow_schema(i)}}}
        return json_answer(worker.url + "/v1/chat/completions", "POST", {"Content-Type": "application/json"},
                           json.dumps(body).encode(), timeout=60)[0]

    plain = {"messages": [{"role": "user", "content": "Count"}], "stream": True, "max_tokens": 3000, "ignore_eos": True,
             **NO_THINK}
    idle, loaded, statuses = measure(worker.url, plain, 1.5, lambda: concurrently(send, range(STALL_SCHEMAS), STALL_WIDTH))
    assert statuses == [400] * STALL_SCHEMAS  # each compiled to its fuel bound, then refused
    # The compile threads share the CPU with the loop and the generation thread, so loaded figures
    # may exceed idle ones by a margin; not by a stall. Measured on the 2-core machine: idle
    # 0.16-0.24 s at worst (other jobs), loaded 0.17-0.27 s; before, the loop compiled the 16 in
    # turn and `/health` took 3.4 s, the stream's largest gap 3.3 s.
    assert loaded.health_max < max(HEALTH_BOUND, 10 * idle.health_max), (idle, loaded)
    assert loaded.stream_gap_max < max(GAP_BOUND, 10 * idle.stream_gap_max), (idle, loaded)
    assert idle.chunks > 10 and loaded.chunks > 10 and loaded.health_probes > 3  # both were measured


def test_after_all_of_that_the_worker_is_healthy_with_every_slot_free_and_no_traceback(worker):
    # Runs last in this module: every request above went to this process.
    assert worker.get_json("/health") == {"max_num_seqs": 2, "active": 0, "status": "ok"}
    entries = [json.loads(line) for line in worker.proc.log_path.read_text().splitlines()]
    assert not [e for e in entries if e.get("level") == "error" or "traceback" in e], entries[-5:]
