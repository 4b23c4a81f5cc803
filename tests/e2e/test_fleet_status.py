"""`GET /v1/fleet/status` against a real stack (`mtpstack up`, tiny models): the figures are the
ones `/metrics` shows, a killed worker goes unhealthy and comes back as a restart, and a worker
started by hand with another width is flagged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from mtpstack.proxy.app import create_app
from tests.e2e.conftest import get_json, get_text, metric, wait_until
from mtpstack.validator import FleetConfig


def status(stack) -> dict:
    code, body = get_json(stack.proxy_url + "/v1/fleet/status")
    assert code == 200, body
    return body


def fresh_status(stack) -> dict:
    """A snapshot whose collection started after this call: the round in progress now may have
    asked the workers before, so the one after it is the first wholly later one."""
    now = status(stack)["rounds"]
    return wait_until(lambda: (s := status(stack))["rounds"] >= now + 2 and s, 10, "a later collection")


def stream_once(stack, max_tokens: int = 24) -> None:
    import openai

    c = openai.OpenAI(base_url=stack.proxy_url + "/v1", api_key="none", max_retries=0)
    for _ in c.completions.create(model="tiny", prompt="def fib(n):", max_tokens=max_tokens, temperature=0, stream=True):
        pass


def test_the_status_reports_the_running_worker_as_it_is(stack):
    s = status(stack)
    w = s["workers"]["w0"]
    assert w["healthy"] is True and w["pid"] == stack.worker_pid("w0")
    assert w["weights"]["agrees"] is True, w["weights"]["mismatches"]
    assert w["weights"]["target"]["path"] == stack.config["workers"]["w0"]["target"]["path"]
    assert len(w["weights"]["target"]["hash"]) == 12
    assert w["coupling"] == {"gate": 2, "width": 2, "agrees": True, "detail": "the gate equals the worker's width"}
    assert w["draft_depth"] == 3
    assert s["models"]["tiny"]["gate"] == [2]


def test_mtpstack_status_json_carries_the_same_fleet_document(stack):
    out = subprocess.run(
        [sys.executable, "-m", "mtpstack", "status", "--run-dir", str(stack.run_dir), "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    fleet = json.loads(out.stdout)["fleet"]
    direct = status(stack)
    assert fleet["schema"] == direct["schema"] == 1
    assert fleet.keys() == direct.keys()
    assert fleet["workers"]["w0"]["pid"] == direct["workers"]["w0"]["pid"] == stack.worker_pid("w0")


def test_acceptance_by_position_and_first_tokens_match_the_metrics(stack):
    stream_once(stack)
    s = fresh_status(stack)
    worker_metrics = get_text(stack.worker_url("w0") + "/metrics")
    by_pos = {p["position"]: p for p in s["workers"]["w0"]["acceptance"]["by_position"]}
    assert sorted(by_pos) == [1, 2, 3]
    for position, p in by_pos.items():
        # Nothing else runs on this stack now, so the worker's counters have not moved since the snapshot.
        assert p["accepted"] == metric(worker_metrics, "mtpstack_worker_accepted_by_position_total", position=str(position))
        assert p["drafted"] == metric(worker_metrics, "mtpstack_worker_drafted_by_position_total", position=str(position))
    assert by_pos[1]["drafted"] > 0
    proxy_metrics = get_text(stack.proxy_url + "/metrics")
    ttft = s["workers"]["w0"]["time_to_first_token_seconds"]
    assert ttft is not None and ttft["n"] >= 1
    assert metric(proxy_metrics, "mtpstack_proxy_time_to_first_token_seconds_count", worker="w0") >= ttft["n"]


def test_the_prefix_cache_and_routing_figures_are_the_ones_metrics_shows(stack):
    stream_once(stack)
    stream_once(stack)  # the same prompt again: a prefix-cache hit on the worker, an affinity hit at the proxy
    s = fresh_status(stack)
    worker_metrics = get_text(stack.worker_url("w0") + "/metrics")
    cache = s["workers"]["w0"]["prefix_cache"]
    lookups = metric(worker_metrics, "mtpstack_worker_prefix_cache_lookups_total")
    hits = metric(worker_metrics, "mtpstack_worker_prefix_cache_hits_total")
    assert (cache["lookups"], cache["hits"]) == (lookups, hits) and hits >= 1
    assert cache["hit_rate"] == hits / lookups
    proxy_metrics = get_text(stack.proxy_url + "/metrics")
    routing = s["models"]["tiny"]["routing"]
    assert routing["policy"] == "affinity"
    for decision, n in routing["decisions"].items():
        assert n == metric(proxy_metrics, "mtpstack_proxy_routing_total", model="tiny", decision=decision)
    assert routing["decisions"]["affinity"] >= 1


def test_a_killed_worker_turns_unhealthy_and_comes_back_as_a_restart(stack):
    pid = stack.worker_pid("w0")
    restarts = status(stack)["workers"]["w0"]["restarts"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not status(stack)["workers"]["w0"]["healthy"], 10, "the status to show the worker unhealthy")
    wait_until(lambda: (w := status(stack)["workers"]["w0"])["healthy"] and w["pid"] != pid, 90, "the restarted worker in the status")
    assert status(stack)["workers"]["w0"]["restarts"] == restarts + 1
    wait_until(lambda: get_json(stack.proxy_url + "/readyz", timeout=2)[0] == 200, 30, "the stack to be ready again")


async def test_a_worker_started_with_another_width_is_flagged_on_gate_and_weights(width_1_worker):
    # The worker runs `--max-num-seqs 1`; the fleet (and so the proxy's gate) says 2.
    data = width_1_worker
    data = {
        **data,
        "proxy": {**data["proxy"], "modelConcurrencyLimits": {"tiny": 2}},
        "workers": {"w0": {**data["workers"]["w0"], "maxNumSeqs": 2}},
    }
    server = TestServer(create_app(FleetConfig.model_validate(data), health_interval=0.2, fleet_interval=0.2))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(server.make_url("/v1/fleet/status")) as r:
                s = await r.json()
    finally:
        await server.close()
    w = s["workers"]["w0"]
    assert (w["coupling"]["gate"], w["coupling"]["width"], w["coupling"]["agrees"]) == (2, 1, False)
    assert any(m == "maxNumSeqs: config `2`, /identity `1`" for m in w["weights"]["mismatches"])
    assert s["ok"] is False
