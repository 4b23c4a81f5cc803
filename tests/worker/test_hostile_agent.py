"""A real worker on the agent tokenizer against hostile input on the agent surfaces (tools,
`tool_choice`, Responses items, JSON schemas): never a 5xx, every refusal a 400 in OpenAI's shape
naming its field, no traceback for a client that leaves mid-stream, and compiling a hostile schema
delays neither `/health` nor another request's tokens."""

from __future__ import annotations

import json
import random
import time

import pytest

from devkit.demo.agent import build_agent_pair
from devkit.hostile import (AGENT_SEEDS, agent_stream, anthropic_refusal_names_a_field, random_agent_request,
                            random_messages_request, seed_request)
from devkit.raw_http import json_answer, leave_streams
from devkit.stall import measure, plain_stream, send_schemas

#: Streams cut in the middle: the issue saw a traceback for 12 of 40.
CUT_STREAMS = 24
FUZZ_SEED, FUZZ_COUNT = 23, 120
#: Hostile schemas sent while the stall is measured, this many at a time: on the loop (before
#: issue 23) 16 of them held `/health` for 3.4 s, so 24 hold it past the bound below even on a
#: quiet machine.
STALL_SCHEMAS, STALL_WIDTH = 24, 8
#: What "not delayed noticeably" allows while they compile, in seconds: below the proxy's health
#: timeout (3 s) and the 3.3-3.4 s the loop stalled when it compiled them itself, with room for a
#: 2-core machine shared with other jobs (seen: 0.85 s, and once 1.6 s under a parallel suite).
HEALTH_BOUND = GAP_BOUND = 2.5


@pytest.fixture(scope="module")
def worker(tmp_path_factory, live_worker_class):
    pair = build_agent_pair(tmp_path_factory.mktemp("agent-hostile"), seed=0)
    with live_worker_class(tmp_path_factory.mktemp("agent-hostile-w"), *pair, depth=2, width=2) as w:
        yield w


def settled(worker, seconds: float = 5.0) -> dict:
    """`/health` once every sequence whose client left is dropped (within a step of the generation loop)."""
    deadline = time.monotonic() + seconds
    while (health := worker.get_json("/health"))["active"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return health


async def test_clients_leaving_agent_streams_leave_no_traceback_and_no_slot(worker):
    port = int(worker.url.rsplit(":", 1)[1])
    statuses = await leave_streams("127.0.0.1", port, [agent_stream(i) for i in range(CUT_STREAMS)])
    assert statuses == [200] * CUT_STREAMS
    assert settled(worker) == {"max_num_seqs": 2, "active": 0, "status": "ok"}
    entries = [json.loads(line) for line in worker.proc.log_path.read_text().splitlines()]  # each line JSON
    assert not [e for e in entries if e.get("level") == "error" or "traceback" in e], entries[-5:]


@pytest.mark.parametrize("name", sorted(AGENT_SEEDS))
def test_each_shape_that_answered_500_or_was_served_is_a_400_naming_its_field(worker, name):
    path, body, param = seed_request(name, "tiny")
    status, headers, payload = json_answer(worker.url + path, "POST", {"Content-Type": "application/json"}, body)
    assert (status, payload["error"]["param"], payload["error"]["type"]) == (400, param, "invalid_request_error"), payload
    assert headers["X-Request-Id"]


def fuzzed_statuses(worker, generate, names_a_field) -> dict[int, int]:
    """`FUZZ_COUNT` requests from `generate(rng, model)`, each answered 200 or 400 and each 400 passing
    `names_a_field(payload)`; how many got each status."""
    rng = random.Random(FUZZ_SEED)
    statuses: dict[int, int] = {}
    for _ in range(FUZZ_COUNT):
        path, body = generate(rng, "tiny")
        status, _, payload = json_answer(worker.url + path, "POST", {"Content-Type": "application/json"}, body, timeout=60)
        statuses[status] = statuses.get(status, 0) + 1
        assert status in (200, 400), (status, payload, body[:300])
        if status == 400:
            assert names_a_field(payload), (payload, body[:300])
    return statuses


def openai_refusal_names_a_field(payload) -> bool:
    error = payload["error"]
    return bool(error["param"] and error["message"] and error["type"] == "invalid_request_error")


def test_generated_hostile_agent_requests_get_no_5xx_and_each_400_names_a_field(worker):
    statuses = fuzzed_statuses(worker, random_agent_request, openai_refusal_names_a_field)
    assert statuses.get(400, 0) > FUZZ_COUNT // 2, statuses  # the generator is hostile, not merely odd


def test_generated_hostile_messages_requests_get_no_5xx_and_each_400_names_a_field_in_anthropics_shape(worker):
    statuses = fuzzed_statuses(worker, random_messages_request, anthropic_refusal_names_a_field)
    assert statuses.get(400, 0) > FUZZ_COUNT // 3 and statuses.get(200, 0), statuses


def test_compiling_hostile_schemas_delays_neither_health_nor_a_plain_stream(worker):
    idle, loaded, statuses = measure(worker.url, plain_stream(3000), 1.5,
                                     lambda: send_schemas(worker.url, range(STALL_SCHEMAS), STALL_WIDTH))
    # Each compiled to its fuel bound, then refused; on a machine so busy that one could not start
    # compiling within its 5 s, that one is refused as the worker being busy instead (issue 40).
    assert set(statuses) <= {400, 503} and statuses.count(400) >= STALL_SCHEMAS // 2, statuses
    # The compile threads share the CPU with the loop and the generation thread (at a lower
    # priority), so loaded figures may exceed idle ones by a margin; not by a stall. Measured on
    # the shared 2-core machine: idle up to 0.24 s at worst (other jobs), loaded up to 0.85 s;
    # before, the loop compiled 16 in turn and `/health` took 3.4 s, the stream's largest gap 3.3 s.
    assert loaded.health_max < max(HEALTH_BOUND, 10 * idle.health_max), (idle, loaded)
    assert loaded.stream_gap_max < max(GAP_BOUND, 10 * idle.stream_gap_max), (idle, loaded)
    assert idle.chunks > 10 and loaded.chunks > 10 and loaded.health_probes > 3  # both were measured


def test_a_prompt_past_the_tokenizers_maximum_is_refused_and_logged_as_json(worker):
    # 150 tools fill the system prompt past the template's 4,096 tokens: transformers warns on its
    # own handler, which printed a text line into the JSON log (the last test reads every line).
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "x " * 40}} for i in range(120)]
    status, _, payload = json_answer(worker.url + "/v1/chat/completions", "POST", {"Content-Type": "application/json"},
                                     json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": tools}).encode())
    assert (status, payload["error"]["code"]) == (400, "context_length_exceeded"), payload


def test_after_all_of_that_the_worker_is_healthy_with_every_slot_free_and_no_traceback(worker):
    # Runs last in this module: every request above went to this process.
    assert settled(worker) == {"max_num_seqs": 2, "active": 0, "status": "ok"}
    entries = [json.loads(line) for line in worker.proc.log_path.read_text().splitlines()]  # each line JSON
    assert not [e for e in entries if e.get("level") == "error" or "traceback" in e], entries[-5:]
