"""Tenants through a real proxy on loopback in front of scripted workers (`devkit.fake_upstream`): whose
key a request carries, fair turns at a full gate, limits answered 429, and usage counted per tenant."""

from __future__ import annotations

import asyncio
import json
import re
import signal

import pytest
from aiohttp import hdrs

from tests.proxy.test_proxy import chat, error_of, eventually

ALICE, BOB = "sk-alice-0123456789", "sk-bob-0123456789"


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keys(tmp_path):
    p = tmp_path / "keys"
    p.write_text(f"# tenants\nalice {ALICE}\nbob\t{BOB}\nsk-legacy-key\n")
    return str(p)


async def tenant_fleet(make_fleet, keys, tenants=None, gate=1, **proxy):
    return await make_fleet({"w1": {"gate": gate}}, proxy={"apiKeysFile": keys, "tenants": tenants or {}, **proxy})


async def queue_behind_a_held_slot(f, tenant_keys: list[tuple[str, str]]):
    """The first request holds the only slot; the others queue in the order given. Returns their tasks."""
    admission = f.state.admissions["m"]
    first = asyncio.create_task(f.client.post("/v1/chat/completions", json=chat("a0", hold="h0"), headers=auth(ALICE)))
    await eventually(lambda: f.fakes["w1"].active == 1, what="the first request holding the slot")
    tasks = [first]
    for i, (tag, key) in enumerate(tenant_keys):
        tasks.append(asyncio.create_task(f.client.post("/v1/chat/completions", json=chat(tag), headers=auth(key))))
        await eventually(lambda: admission.waiting == i + 1, what=f"request {tag} waiting")
    f.fakes["w1"].release("h0")
    return [await t for t in tasks]


async def test_a_tenant_with_many_waiting_delays_anothers_request_by_one_turn(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys)
    answers = await queue_behind_a_held_slot(f, [(f"a{i}", ALICE) for i in range(1, 6)] + [("b0", BOB)])
    assert [r.status for r in answers] == [200] * 7
    assert f.fakes["w1"].arrivals == ["a0", "a1", "b0", "a2", "a3", "a4", "a5"]
    f.assert_no_violations()


async def test_without_fair_queueing_the_line_is_first_come_first_served(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys, fairQueueing=False)
    await queue_behind_a_held_slot(f, [(f"a{i}", ALICE) for i in range(1, 6)] + [("b0", BOB)])
    assert f.fakes["w1"].arrivals == ["a0", "a1", "a2", "a3", "a4", "a5", "b0"]


async def test_turns_go_round_robin_by_weight_first_come_first_served_within_a_tenant(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys, tenants={"alice": {"weight": 2}})
    waiting = [(f"b{i}", BOB) for i in range(3)] + [(f"a{i}", ALICE) for i in range(1, 7)]
    await queue_behind_a_held_slot(f, waiting)
    # bob queued first, yet alice (weight 2) gets two turns for each of bob's once both wait
    assert f.fakes["w1"].arrivals == ["a0", "a1", "b0", "a2", "a3", "b1", "a4", "a5", "b2", "a6"]


async def test_a_request_sent_back_by_a_worker_still_goes_first(make_fleet, keys):
    # the admission's own guarantee, with tenants: a retried request is ahead of every tenant's turn
    f = await tenant_fleet(make_fleet, keys)
    a = f.state.admissions["m"]
    u = await a.acquire(tenant="alice")
    waiter = asyncio.create_task(a.acquire(tenant="bob"))
    await eventually(lambda: a.waiting == 1)
    retried = asyncio.create_task(a.acquire(retry=True, tenant="alice"))
    await eventually(lambda: a.waiting == 2)
    a.release(u)
    assert await retried is u and not waiter.done()
    a.release(u)
    assert await waiter is u
    a.release(u)


async def test_requests_per_minute_is_a_429_naming_tenant_and_limit_with_retry_after(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys, tenants={"alice": {"requestsPerMinute": 2}})
    for _ in range(2):
        assert (await f.client.post("/v1/chat/completions", json=chat(), headers=auth(ALICE))).status == 200
    r = await f.client.post("/v1/chat/completions", json=chat(), headers=auth(ALICE))
    assert r.status == 429 and 1 <= int(r.headers[hdrs.RETRY_AFTER]) <= 60
    error = await error_of(r)
    assert error["code"] == "tenant_requests_per_minute" and error["type"] == "rate_limit_error"
    assert "`alice`" in error["message"] and "requestsPerMinute" in error["message"]
    assert len(f.fakes["w1"].arrivals) == 2  # refused at the proxy
    # bob is not limited by alice's limit, and his answers never name her
    r = await f.client.post("/v1/chat/completions", json=chat(), headers=auth(BOB))
    assert r.status == 200 and "alice" not in await r.text()
    metrics = (await (await f.client.get("/metrics")).text())
    assert 'mtpstack_proxy_tenant_requests_total{status="429",tenant="alice"} 1.0' in metrics
    assert 'mtpstack_proxy_refusals_total{code="tenant_requests_per_minute",model="m"} 1.0' in metrics


async def test_a_limit_on_messages_is_anthropics_429_rate_limit_error(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys, tenants={"bob": {"requestsPerMinute": 1}})
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    assert (await f.client.post("/v1/messages", json=body, headers={"X-Api-Key": BOB})).status == 200
    r = await f.client.post("/v1/messages", json=body, headers={"X-Api-Key": BOB})
    assert r.status == 429 and int(r.headers[hdrs.RETRY_AFTER]) >= 1
    payload = await r.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "rate_limit_error"
    assert "`bob`" in payload["error"]["message"]


async def test_max_concurrent_counts_waiting_and_admitted_requests(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys, tenants={"alice": {"maxConcurrent": 1}})
    held = asyncio.create_task(f.client.post("/v1/chat/completions", json=chat(hold="h"), headers=auth(ALICE)))
    await eventually(lambda: f.fakes["w1"].active == 1)
    r = await f.client.post("/v1/chat/completions", json=chat(), headers=auth(ALICE))
    assert r.status == 429 and (await error_of(r))["code"] == "tenant_max_concurrent" and int(r.headers[hdrs.RETRY_AFTER]) >= 1
    f.fakes["w1"].release("h")
    assert (await held).status == 200
    assert (await f.client.post("/v1/chat/completions", json=chat(), headers=auth(ALICE))).status == 200
    assert f.state.tenants.all["alice"].inflight == 0


async def test_tokens_per_minute_counts_uncached_prompt_and_completion_tokens(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys, tenants={"alice": {"tokensPerMinute": 12}})
    # 10 prompt tokens of which 4 cached, 1 completion: 7 counted
    assert (await f.client.post("/v1/chat/completions", json=chat(prompt_tokens=10, cached_tokens=4), headers=auth(ALICE))).status == 200
    assert f.state.tenants.all["alice"].tokens.total(__import__("time").monotonic()) == 7
    assert (await f.client.post("/v1/chat/completions", json=chat(prompt_tokens=10, cached_tokens=4), headers=auth(ALICE))).status == 200
    r = await f.client.post("/v1/chat/completions", json=chat(), headers=auth(ALICE))
    assert r.status == 429 and (await error_of(r))["code"] == "tenant_tokens_per_minute"
    assert 1 <= int(r.headers[hdrs.RETRY_AFTER]) <= 60


def series(metrics: str, name: str, tenant: str) -> float:
    m = re.search(rf'^mtpstack_proxy_{name}\{{tenant="{tenant}"\}} (\S+)$', metrics, re.M)
    return float(m[1]) if m else 0.0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"])
async def test_usage_is_the_workers_for_plain_answers_and_streams_alike(make_fleet, keys, path):
    f = await tenant_fleet(make_fleet, keys)
    body = {"model": "m", "max_tokens": 8, "x_fake": {"prompt_tokens": 30, "cached_tokens": 20, "chunks": 5}}
    body |= {"prompt": "x"} if path == "/v1/completions" else {"input": "x"} if path == "/v1/responses" else {
        "messages": [{"role": "user", "content": "x"}]}
    assert (await f.client.post(path, json=body, headers=auth(ALICE))).status == 200
    r = await f.client.post(path, json=body | {"stream": True}, headers=auth(ALICE))
    assert r.status == 200
    text = await r.text()
    assert ": usage" not in text.split("\n\n")[-2]  # the final event goes out as the worker's API ends a stream
    await eventually(lambda: sum(f.state.tenants.all["alice"].by_status.values()) == 2)
    metrics = await (await f.client.get("/metrics")).text()
    assert series(metrics, "tenant_prompt_tokens_total", "alice") == 60
    assert series(metrics, "tenant_cached_tokens_total", "alice") == 40
    assert series(metrics, "tenant_completion_tokens_total", "alice") == 1 + 5
    assert series(metrics, "tenant_prompt_tokens_total", "bob") == 0
    status = await f.collector.collect()
    assert status["tenants"]["alice"] | {"queue_seconds": 0} == {
        "requests": {"200": 2}, "prompt_tokens": 60, "cached_tokens": 40, "completion_tokens": 6, "queue_seconds": 0, "inflight": 0}
    assert status["tenants_not_shown"] == 0


async def test_a_client_that_leaves_mid_stream_is_charged_what_it_was_sent(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys)
    r = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=400, interval=0.01, prompt_tokens=50),
                            headers=auth(BOB))
    got = 0
    while got < 3:
        got += (await r.content.readuntil(b"\n\n")).startswith(b"data: {")
    r.close()
    tenant = f.state.tenants.all["bob"]
    await eventually(lambda: sum(tenant.by_status.values()) == 1, what="the request finished")
    assert tenant.by_status == {"499": 1}
    assert tenant.prompt_tokens == 50
    assert 3 <= tenant.completion_tokens < 400
    assert tenant.completion_tokens <= f.fakes["w1"].chunks_written


async def test_a_wrong_key_is_401_naming_no_tenant_and_key_alone_lines_are_default(make_fleet, keys):
    f = await tenant_fleet(make_fleet, keys)
    r = await f.client.post("/v1/chat/completions", json=chat(), headers=auth("sk-alice-01234567890"))
    assert r.status == 401
    text = await r.text()
    assert "alice" not in text and "bob" not in text and "default" not in text
    assert (await f.client.post("/v1/chat/completions", json=chat(), headers=auth("sk-legacy-key"))).status == 200
    assert f.state.tenants.all["default"].by_status == {"200": 1}


async def test_the_official_openai_client_sees_a_rate_limit_error(make_fleet, keys):
    import openai

    f = await tenant_fleet(make_fleet, keys, tenants={"alice": {"requestsPerMinute": 1}})
    client = openai.AsyncOpenAI(base_url=str(f.client.make_url("/v1")), api_key=ALICE, max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError) as e:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "tenant_requests_per_minute" and "`alice`" in e.value.message
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    await client.close()


def test_the_tenants_windows_say_when_a_request_fits_again():
    from mtpstack.proxy.tenants import Window

    w = Window()
    w.add(1000.2, 3)
    w.add(1030.5, 2)
    assert w.total(1030.9) == 5 and w.total(1059.9) == 5
    assert w.total(1060.0) == 2  # the first second left the window
    assert w.retry_after(1030.9, 5) == 30  # second 1000 leaves at 1060
    assert w.retry_after(1030.9, 3) == 30
    assert w.retry_after(1030.9, 2) == 60  # both must go: second 1030 leaves at 1090
    assert w.retry_after(1030.9, 6) == 1


async def test_sighup_rereads_keys_and_tenants_keeping_in_flight_requests_and_a_bad_reload_changes_nothing(tmp_path):
    import sys

    import aiohttp

    from mtpstack.runtime import Process, free_port, url_of
    from tests.proxy.test_cli import ROOT, start_fake, wait_ready

    up_port, proxy_port = free_port(), free_port()
    fake = start_fake(tmp_path, up_port, "--gate", "1")
    keys = tmp_path / "keys"
    keys.write_text(f"alice {ALICE}\n")
    cfg = tmp_path / "fleet.json"

    def write_config(tenants: dict) -> None:
        cfg.write_text(json.dumps({
            "proxy": {"port": proxy_port, "apiKeysFile": str(keys), "tenants": tenants},
            "workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": up_port}},
        }))

    write_config({"alice": {}})
    log_path = tmp_path / "proxy.log"
    proc = Process([sys.executable, "-m", "mtpstack", "proxy", "--config", str(cfg)], log_path=log_path,
                   name="proxy", kind="proxy", url=url_of("127.0.0.1", proxy_port), cwd=ROOT).start()

    def events(name: str) -> list[dict]:
        return [e for e in (json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{"))
                if e.get("event") == name]

    base = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
    try:
        await wait_ready(fake, "/health")
        await wait_ready(proc, "/readyz")
        async with aiohttp.ClientSession() as s:
            plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            body = plain | {"stream": True, "x_fake": {"chunks": 6, "interval": 0.2}}
            async with s.post(base, json=body, headers=auth(ALICE)) as streaming:
                await streaming.content.readuntil(b"\n\n")  # alice's stream is in flight
                keys.write_text(f"bob {BOB}\n")
                write_config({"bob": {"requestsPerMinute": 1}})
                proc.signal(signal.SIGHUP)
                await eventually(lambda: len(events("reloaded")) == 1, timeout=10, what="the reload")
                rest = await streaming.read()
            assert streaming.status == 200 and rest.endswith(b"data: [DONE]\n\n")
            async with s.post(base, json=plain, headers=auth(ALICE)) as r:
                assert r.status == 401
            async with s.post(base, json=plain, headers=auth(BOB)) as r:
                assert r.status == 200
            # a keys file the validator refuses: the set in effect stays, and the log says why
            keys.write_text(f"bob {BOB}\ncarol {BOB}\n")
            proc.signal(signal.SIGHUP)
            await eventually(lambda: len(events("reload_failed")) == 1, timeout=10, what="the failed reload")
            assert "line 2 repeats the key of line 1" in json.dumps(events("reload_failed")) and BOB not in log_path.read_text()
            async with s.post(base, json=plain, headers=auth(BOB)) as r:
                assert r.status == 429  # bob's limit of the reload before still holds
            async with s.get(f"http://127.0.0.1:{proxy_port}/v1/fleet/status", headers=auth(BOB)) as r:
                await r.json()
        requests = events("request")
        assert [(e["tenant"], e["status"]) for e in requests] == [("alice", 200), (None, 401), ("bob", 200), ("bob", 429)]
    finally:
        proc.stop()
        fake.stop()


ANTHROPIC_CLIENT = """
import json, sys
import anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
ask = lambda: client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
ask()
try:
    ask()
    print(json.dumps({"refused": False}))
except anthropic.RateLimitError as e:
    print(json.dumps({"refused": True, "status": e.status_code, "type": e.body["error"]["type"],
                      "message": e.body["error"]["message"], "retry_after": e.response.headers.get("retry-after")}))
"""


async def test_the_official_anthropic_client_sees_a_rate_limit_error_naming_its_tenant(make_fleet, keys, clients_python):
    python = clients_python
    f = await tenant_fleet(make_fleet, keys, tenants={"bob": {"requestsPerMinute": 1}})
    proc = await asyncio.create_subprocess_exec(str(python), "-c", ANTHROPIC_CLIENT, str(f.client.make_url("")).rstrip("/"), BOB,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["refused"] and seen["status"] == 429 and seen["type"] == "rate_limit_error"
    assert "`bob`" in seen["message"] and "requestsPerMinute" in seen["message"] and 1 <= int(seen["retry_after"]) <= 60
