"""A real worker (the agent tokenizer) under a flood of hostile schemas, each worked on by llguidance
until its fuel runs out: another client's tiny schema, the flooding client's own tiny schema and a
schema compiled before the flood are all answered 200 while the flood is still being worked on; what
the worker cannot take is a 429 or 503 `worker_busy` with `Retry-After`, never a 400 blaming the
schema. Order, not time, is asserted: each probe's answer comes before the flood's last one."""

from __future__ import annotations

import json
import socket

import pytest

from devkit.demo.agent import build_agent_pair
from devkit.stall import BENIGN_SCHEMA, flood, flood_bodies, fuel_schema, post, schema_request

#: Hostile schemas sent at once from one client: past what its line holds (2 compiling, 8 waiting).
FLOOD = 40
#: When the probes go, after the flood began: its first schemas are compiling by then.
PROBE_DELAY = 0.3
#: Another client: a second loopback address (the worker tells clients apart by address).
OTHER_CLIENT = "127.0.0.2"
#: A schema compiled before the flood: found in the worker's cache.
WARM_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
FUEL_MESSAGE = "too big"  # llguidance's refusal once its lexer fuel runs out


def _second_loopback_address() -> bool:
    with socket.socket() as s:
        try:
            s.bind((OTHER_CLIENT, 0))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def worker(tmp_path_factory, live_worker_class):
    pair = build_agent_pair(tmp_path_factory.mktemp("flood"), seed=0)
    with live_worker_class(tmp_path_factory.mktemp("flood-w"), *pair, depth=2, width=4) as w:
        yield w


@pytest.fixture(scope="module")
def flooded(worker):
    if not _second_loopback_address():
        pytest.skip(f"{OTHER_CLIENT} is not a local address here (Linux routes all of 127/8 to loopback)")
    assert post(worker.url, schema_request(WARM_SCHEMA, 16)).status == 200
    probes = {
        "other client": (PROBE_DELAY, schema_request(BENIGN_SCHEMA, 16), OTHER_CLIENT),
        "same client": (PROBE_DELAY, schema_request({**BENIGN_SCHEMA, "title": "own"}, 16), None),
        "compiled before": (PROBE_DELAY, schema_request(WARM_SCHEMA, 16), None),
    }
    return flood(worker.url, flood_bodies(range(FLOOD)), probes)


def _answered_json(answer) -> dict:
    assert answer.status == 200, (answer.status, answer.body[:300])
    content = json.loads(answer.body)["choices"][0]["message"]["content"]
    return json.loads(content)


@pytest.mark.parametrize("probe", ["other client", "same client", "compiled before"])
def test_a_tiny_schema_sent_during_a_flood_of_hostile_ones_is_answered_before_the_flood_is(flooded, probe):
    answer = flooded.probes[probe]
    assert isinstance(_answered_json(answer), dict)
    assert answer.ended < flooded.last_hostile_answer, flooded.statuses


def test_what_the_flood_gets_is_its_fuel_refusal_or_worker_busy_never_a_compile_deadline(flooded):
    statuses = flooded.statuses
    assert set(statuses) <= {400, 429, 503}, statuses
    assert statuses.get(429, 0) >= FLOOD // 2, statuses  # past its line (2 compiling, 8 waiting): refused at once
    for answer in flooded.hostile:
        error = answer.error()
        if answer.status == 400:  # compiled to its fuel bound: the schema's own fault, named
            assert (error["param"], error["code"]) == ("response_format", "invalid_request"), error
            assert FUEL_MESSAGE in error["message"] and "did not compile" not in error["message"], error
        else:
            assert error["code"] == "worker_busy" and error["param"] is None, error
            assert "busy" in error["message"] and int(answer.headers["Retry-After"]) >= 1, (answer.headers, error)
            assert error["type"] == ("rate_limit_error" if answer.status == 429 else "server_error"), error
            assert answer.headers["X-Request-Id"]


def test_a_flood_on_the_responses_api_is_refused_as_busy_in_the_same_shape(worker):
    bodies = [{"input": "x", "max_output_tokens": 2, "reasoning": {"effort": "none"},
               "text": {"format": {"type": "json_schema", "name": "x", "schema": fuel_schema(i)}}} for i in range(1_000, 1_020)]
    result = flood(worker.url, bodies, {}, path="/v1/responses")
    busy = [a for a in result.hostile if a.status == 429]
    assert len(busy) >= len(bodies) // 3, result.statuses
    for answer in busy:
        error = answer.error()
        assert (error["code"], error["param"], error["type"]) == ("worker_busy", None, "rate_limit_error"), error
        assert int(answer.headers["Retry-After"]) >= 1
    assert set(result.statuses) <= {400, 429, 503}, result.statuses


def test_afterwards_the_worker_is_healthy_with_nothing_waiting_and_no_error_logged(worker, flooded):
    health = worker.get_json("/health")
    assert health["status"] == "ok" and health["active"] == 0, health
    metrics = worker.get_text("/metrics")
    assert 'mtpstack_worker_rejected_total{code="worker_busy"}' in metrics
    entries = [json.loads(line) for line in worker.proc.log_path.read_text().splitlines()]
    assert not [e for e in entries if e.get("level") == "error" or "traceback" in e], entries[-5:]
