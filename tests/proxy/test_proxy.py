"""The proxy over HTTP, against real aiohttp upstreams on loopback that count their own
concurrency and refuse (loudly) anything above their batch width."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from aiohttp import hdrs


def chat(tag=None, stream=False, model="m", **fake):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if tag is not None:
        fake["tag"] = tag
    if fake:
        body["x_fake"] = fake
    return body


async def error_of(resp) -> dict:
    body = await resp.json()
    assert set(body["error"]) >= {"message", "type", "code"}, body
    return body["error"]


async def eventually(predicate, timeout: float = 3.0, what: str = "condition") -> None:
    """Wait until `predicate()` holds; the bound only keeps a broken proxy from hanging the suite."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        await asyncio.sleep(0.005)


# -- admission --------------------------------------------------------------------------
async def test_gate_of_2_is_never_exceeded_by_64_concurrent_clients(make_fleet):
    f = await make_fleet({"w1": {"gate": 2}}, proxy={"queue": {"maxWaiting": 64, "timeoutSeconds": 30}})
    upstream = f.state.upstreams["w1"]
    seen: list[int] = []
    sampling = True

    async def sample():
        while sampling:
            seen.append(upstream.inflight)
            await asyncio.sleep(0)

    sampler = asyncio.create_task(sample())
    reqs = [f.client.post("/v1/chat/completions", json=chat(i, stream=i % 2 == 0, delay=0.005, chunks=3)) for i in range(64)]
    resps = await asyncio.gather(*reqs)
    bodies = await asyncio.gather(*(r.read() for r in resps))
    sampling = False
    await sampler
    assert [r.status for r in resps] == [200] * 64
    assert all(b"[DONE]" in b for b, r in zip(bodies, resps) if r.headers[hdrs.CONTENT_TYPE] == "text/event-stream")
    f.assert_no_violations()
    assert f.fakes["w1"].max_active == 2  # the gate was used fully, and never more
    assert max(seen) == 2 and upstream.inflight == 0
    assert f.fakes["w1"].served == 64


async def test_queued_requests_are_served_in_arrival_order(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    admission = f.state.admissions["m"]
    holder = asyncio.create_task(f.client.post("/v1/chat/completions", json=chat("hold", hold="first")))
    await eventually(lambda: f.state.upstreams["w1"].inflight == 1, what="first request admitted")
    tasks = []
    for i in range(8):
        tasks.append(asyncio.create_task(f.client.post("/v1/chat/completions", json=chat(i))))
        await eventually(lambda: admission.waiting == i + 1, what=f"request {i} queued")
    f.fakes["w1"].release("first")
    resps = await asyncio.gather(holder, *tasks)
    assert [r.status for r in resps] == [200] * 9
    assert f.fakes["w1"].arrivals == ["hold", *range(8)]


async def test_requests_spread_to_the_least_loaded_worker(make_fleet):
    f = await make_fleet({"a": {"gate": 2}, "b": {"gate": 2}})
    resps = await asyncio.gather(*(f.client.post("/v1/chat/completions", json=chat(i, delay=0.2)) for i in range(4)))
    assert [r.status for r in resps] == [200] * 4
    assert f.fakes["a"].max_active == 2 and f.fakes["b"].max_active == 2
    f.assert_no_violations()


async def past_a_full_queue(make_fleet, path: str, queued_path: str | None = None):
    """A third request to `path` while one is held by a gate of 1 and one (to `queued_path`) waits in a
    queue of 1: its response, and the two others' gathered."""
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"queue": {"maxWaiting": 1, "timeoutSeconds": 30}})
    held = asyncio.create_task(f.client.post(path, json=chat(hold="first")))
    await eventually(lambda: f.state.upstreams["w1"].inflight == 1, what="first request admitted")
    queued = asyncio.create_task(f.client.post(queued_path or path, json=chat()))
    await eventually(lambda: f.state.admissions["m"].waiting == 1, what="second request queued")
    third = await f.client.post(path, json=chat())
    f.fakes["w1"].release("first")
    return third, asyncio.gather(held, queued)


async def past_a_queue_timeout(make_fleet, path: str):
    """A request to `path` that waits out a 0.1 s queue timeout behind one held by a gate of 1: its
    response, the fleet, and the held one."""
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"queue": {"maxWaiting": 4, "timeoutSeconds": 0.1}})
    held = asyncio.create_task(f.client.post(path, json=chat(hold="first")))
    await eventually(lambda: f.state.upstreams["w1"].inflight == 1)
    timed_out = await f.client.post(path, json=chat())
    f.fakes["w1"].release("first")
    return timed_out, f, held


async def test_queue_full_answers_429_with_retry_after(make_fleet):
    r, others = await past_a_full_queue(make_fleet, "/v1/chat/completions")
    assert r.status == 429
    assert int(r.headers[hdrs.RETRY_AFTER]) >= 1
    err = await error_of(r)
    assert err["code"] == "queue_full" and err["type"] == "rate_limit_error"
    assert [x.status for x in await others] == [200, 200]


async def test_queue_timeout_answers_429_with_retry_after(make_fleet):
    r, f, held = await past_a_queue_timeout(make_fleet, "/v1/chat/completions")
    assert r.status == 429 and int(r.headers[hdrs.RETRY_AFTER]) >= 1
    assert (await error_of(r))["code"] == "queue_timeout"
    assert f.state.admissions["m"].waiting == 0
    assert (await held).status == 200


async def test_a_gate_wider_than_the_worker_turns_the_excess_into_429s(make_fleet):
    """The failure the coupling rule prevents: the proxy admits 4, the worker serves 1."""
    f = await make_fleet({"w1": {"gate": 1, "proxy_gate": 4}})
    tasks = [asyncio.create_task(f.client.post("/v1/chat/completions", json=chat(hold="all"))) for _ in range(4)]
    await eventually(lambda: f.fakes["w1"].violations == 3, what="three refused")
    f.fakes["w1"].release("all")
    resps = await asyncio.gather(*tasks)
    codes = sorted(r.status for r in resps)
    assert codes.count(429) == 3 and codes.count(200) == 1
    assert f.fakes["w1"].violations == 3


# -- streaming, disconnects, dying workers ------------------------------------------------
async def test_stream_is_passed_through_chunk_by_chunk(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    # 5 chunks 0.1 s apart: the first is read while the worker has 0.4 s of writing left
    r = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=5, interval=0.1))
    assert r.status == 200 and r.headers[hdrs.CONTENT_TYPE] == "text/event-stream"
    first = await r.content.readuntil(b"\n\n")
    # the first event arrives while the worker is still writing the rest
    assert first.startswith(b"data: ") and f.fakes["w1"].active == 1
    rest = await r.read()
    assert rest.count(b"data: ") == 5 and rest.endswith(b"data: [DONE]\n\n")


async def test_client_disconnect_frees_the_slot_and_cancels_upstream(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    r = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=1000, interval=0.02))
    await r.content.readuntil(b"\n\n")
    assert f.state.upstreams["w1"].inflight == 1
    r.close()  # drop the connection mid-stream
    await eventually(lambda: f.state.upstreams["w1"].inflight == 0, what="slot freed")
    await eventually(lambda: f.fakes["w1"].cancelled == 1, what="upstream request cancelled")
    r2 = await f.client.post("/v1/chat/completions", json=chat())
    assert r2.status == 200


async def test_client_disconnect_while_waiting_for_a_plain_answer_frees_the_slot(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    task = asyncio.create_task(f.client.post("/v1/chat/completions", json=chat(delay=10)))
    await eventually(lambda: f.fakes["w1"].active == 1)
    task.cancel()
    await eventually(lambda: f.state.upstreams["w1"].inflight == 0, what="slot freed")
    await eventually(lambda: f.fakes["w1"].active == 0, what="upstream request cancelled")


async def test_client_disconnect_while_queued_leaves_the_queue(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    held = asyncio.create_task(f.client.post("/v1/chat/completions", json=chat(hold="first")))
    await eventually(lambda: f.state.upstreams["w1"].inflight == 1)
    queued = asyncio.create_task(f.client.post("/v1/chat/completions", json=chat("never")))
    await eventually(lambda: f.state.admissions["m"].waiting == 1)
    queued.cancel()
    await eventually(lambda: f.state.admissions["m"].waiting == 0, what="queue emptied")
    f.fakes["w1"].release("first")
    assert (await held).status == 200
    assert "never" not in f.fakes["w1"].arrivals


async def test_worker_dying_mid_stream_ends_the_stream_with_an_error_event(make_fleet):
    # Slow health checks: the worker stays marked unhealthy for the rest of the test.
    f = await make_fleet({"w1": {"gate": 1}}, health_interval=60)
    r = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=10, die_after=3))
    assert r.status == 200
    body = await r.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert len(events) == 4 and b"[DONE]" not in body
    err = json.loads(events[-1].removeprefix(b"data: "))["error"]
    assert err["code"] == "upstream_disconnected"
    assert f.state.upstreams["w1"].inflight == 0
    assert not f.state.upstreams["w1"].healthy
    r2 = await f.client.post("/v1/chat/completions", json=chat())
    assert r2.status == 503 and (await error_of(r2))["code"] == "no_healthy_worker"


# -- upstream failures --------------------------------------------------------------------
async def test_worker_refusing_connections_gives_502_then_503(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}}, health_interval=60)
    await f.servers["w1"].close()
    r = await f.client.post("/v1/chat/completions", json=chat())
    assert r.status == 502 and (await error_of(r))["code"] == "upstream_unreachable"
    r = await f.client.post("/v1/chat/completions", json=chat())
    assert r.status == 503 and int(r.headers[hdrs.RETRY_AFTER]) >= 1
    assert (await error_of(r))["code"] == "no_healthy_worker"


async def test_unhealthy_worker_gets_no_traffic_until_it_recovers(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    f.fakes["w1"].health_status = 503
    await eventually(lambda: not f.state.upstreams["w1"].healthy, what="worker marked unhealthy")
    assert (await f.client.get("/readyz")).status == 503
    r = await f.client.post("/v1/chat/completions", json=chat("x"))
    assert r.status == 503 and int(r.headers[hdrs.RETRY_AFTER]) >= 1
    assert f.fakes["w1"].arrivals == []
    f.fakes["w1"].health_status = 200
    await eventually(lambda: f.state.upstreams["w1"].healthy, what="worker marked healthy")
    assert (await f.client.get("/readyz")).status == 200
    assert (await f.client.post("/v1/chat/completions", json=chat())).status == 200


@pytest.fixture
def unaccepting_port():
    """A port whose accept queue is full: the kernel drops new SYNs, so a connect hangs."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    yield port
    for c in fillers:
        c.close()
    listener.close()


async def test_worker_not_accepting_connections_gives_504(aiohttp_client, unaccepting_port):
    from mtpstack.proxy import create_app
    from mtpstack.validator import FleetConfig

    config = FleetConfig.model_validate(
        {
            "proxy": {"timeouts": {"connectSeconds": 0.2}},
            "workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": unaccepting_port}},
        }
    )
    app = create_app(config, health_interval=60)
    client = await aiohttp_client(app)
    from mtpstack.proxy import STATE

    state = app[STATE]
    state.admissions["m"].set_healthy(state.upstreams["w"], True, "as if a check had just passed")
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status == 504 and (await error_of(r))["code"] == "upstream_timeout"
    assert "did not accept a connection" in (await r.text())


async def test_slow_first_byte_gives_504(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"timeouts": {"firstByteSeconds": 0.1}})
    r = await f.client.post("/v1/chat/completions", json=chat(delay=2))
    assert r.status == 504 and (await error_of(r))["code"] == "upstream_timeout"
    assert f.state.upstreams["w1"].inflight == 0


async def test_stalled_stream_ends_with_a_timeout_event(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"timeouts": {"idleSeconds": 0.1}})
    r = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=3, interval=2))
    body = await r.read()
    last = [e for e in body.split(b"\n\n") if e][-1]
    assert json.loads(last.removeprefix(b"data: "))["error"]["code"] == "upstream_timeout"
    assert f.state.upstreams["w1"].inflight == 0


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_request"),
        (b"[1, 2]", 400, "invalid_request"),
        (b'{"messages": []}', 400, "invalid_request"),
        (b'{"model": 7}', 400, "invalid_request"),
        (b'{"model": "nope", "messages": []}', 404, "model_not_found"),
        (b'{"model": "m", "pad": "' + b"x" * 2000 + b'"}', 413, "body_too_large"),
    ],
    ids=["not-json", "not-object", "no-model", "model-not-string", "unknown-model", "too-large"],
)
async def test_bad_input_gets_a_4xx_and_never_reaches_a_worker(make_fleet, body, status, code):
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"maxBodyBytes": 1000})
    r = await f.client.post("/v1/chat/completions", data=body, headers={hdrs.CONTENT_TYPE: "application/json"})
    assert r.status == status
    err = await error_of(r)
    assert err["code"] == code
    if code == "model_not_found":
        assert "`m`" in err["message"]
    assert f.fakes["w1"].arrivals == []


async def test_chunked_body_over_the_limit_is_413(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"maxBodyBytes": 1000})

    async def gen():
        for _ in range(10):
            yield b"x" * 500

    r = await f.client.post("/v1/completions", data=gen())
    assert r.status == 413 and (await error_of(r))["code"] == "body_too_large"


@pytest.fixture
def keys_file(tmp_path):
    p = tmp_path / "keys"
    p.write_text("# proxy keys\nsk-first-key\n\nsk-second-key\n")
    return str(p)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer sk-wrong"}, 401),
        ({"Authorization": "Basic sk-first-key"}, 401),
        ({"Authorization": "Bearer sk-second-key"}, 200),
        ({"X-Api-Key": "sk-first-key"}, 200),
    ],
    ids=["missing", "wrong", "wrong-scheme", "bearer", "x-api-key"],
)
async def test_api_keys_are_required_when_configured(make_fleet, keys_file, headers, status, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"apiKeysFile": keys_file})
    r = await f.client.post("/v1/chat/completions", json=chat(), headers=headers)
    assert r.status == status
    if status == 401:
        assert (await error_of(r))["code"] == "invalid_api_key"
        assert f.fakes["w1"].arrivals == []
    else:
        # the key stays at the proxy
        sent = {k.lower() for k in f.fakes["w1"].last_headers}
        assert "authorization" not in sent and "x-api-key" not in sent
    assert (await f.client.get("/v1/models", headers=headers)).status == status
    assert (await f.client.get("/healthz")).status == 200
    assert "sk-" not in caplog.text


@pytest.mark.parametrize("path", ["/", "/api/hello"])
async def test_a_clients_reachability_probe_is_answered_without_a_key_and_reaches_no_worker(make_fleet, keys_file, path):
    """Claude Code sends `HEAD /api/hello` at start: 200, not a 404 in its log, with or without keys."""
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"apiKeysFile": keys_file})
    for method in ("HEAD", "GET"):
        r = await f.client.request(method, path)
        assert r.status == 200, (method, path, await r.text())
    assert (await f.client.get(path)).headers["Content-Type"].startswith("application/json")
    assert (await f.client.post(path, json={})).status == 405
    assert f.fakes["w1"].arrivals == []


# -- Anthropic's Messages API ---------------------------------------------------------------
def anthropic_error(body: dict) -> dict:
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


async def test_a_full_queue_is_anthropics_529_overloaded_with_retry_after_on_messages(make_fleet):
    r, others = await past_a_full_queue(make_fleet, "/v1/messages?beta=true", "/v1/messages")
    assert r.status == 529 and int(r.headers[hdrs.RETRY_AFTER]) >= 1
    assert anthropic_error(await r.json())["type"] == "overloaded_error"
    assert [x.status for x in await others] == [200, 200]


async def test_a_queue_timeout_on_messages_is_a_429_rate_limit_error_with_retry_after(make_fleet):
    r, _, held = await past_a_queue_timeout(make_fleet, "/v1/messages")
    assert r.status == 429 and int(r.headers[hdrs.RETRY_AFTER]) >= 1
    assert anthropic_error(await r.json())["type"] == "rate_limit_error"
    assert (await held).status == 200


async def test_counting_tokens_takes_no_slot_and_waits_behind_no_generation(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"queue": {"maxWaiting": 1, "timeoutSeconds": 30}})
    held = asyncio.create_task(f.client.post("/v1/messages", json=chat(hold="first")))
    await eventually(lambda: f.state.upstreams["w1"].inflight == 1)
    r = await f.client.post("/v1/messages/count_tokens?beta=true", json=chat())
    assert r.status == 200 and not held.done()
    assert f.state.upstreams["w1"].inflight == 1 and f.state.admissions["m"].waiting == 0
    f.fakes["w1"].release("first")
    assert (await held).status == 200


@pytest.mark.parametrize("path", ["/v1/messages?beta=true", "/v1/messages/count_tokens"])
async def test_messages_refusals_take_anthropics_shape(make_fleet, keys_file, path):
    f = await make_fleet({"w1": {"gate": 1}, "old": {"gate": 1, "model": "b", "backend": "mlx-lm", "target": "/srv/b"}},
                         proxy={"apiKeysFile": keys_file})
    key = {"x-api-key": "sk-first-key", "anthropic-version": "2023-06-01"}
    r = await f.client.post(path, json=chat())
    error = anthropic_error(await r.json())
    assert r.status == 401 and error["type"] == "authentication_error" and "x-api-key" in error["message"]
    r = await f.client.post(path, json=chat(model="claude-opus-4"), headers=key)
    assert r.status == 404 and "claude-opus-4" in anthropic_error(await r.json())["message"]
    r = await f.client.post(path, json=chat(model="b"), headers=key)
    assert r.status == 400 and "mlx-lm" in anthropic_error(await r.json())["message"]
    assert (await f.client.post(path, json=chat(), headers=key)).status == 200
    assert (await f.client.post(path, json=chat(), headers={"Authorization": "Bearer sk-second-key"})).status == 200


# -- forwarding details -------------------------------------------------------------------
async def test_mlx_lm_workers_get_the_model_they_loaded(make_fleet):
    f = await make_fleet(
        {"native": {"gate": 1, "model": "a"}, "mlxlm": {"gate": 1, "model": "b", "backend": "mlx-lm", "target": "/srv/models/b-4bit"}}
    )
    assert (await f.client.post("/v1/chat/completions", json=chat(model="a"))).status == 200
    assert (await f.client.post("/v1/completions", json={"model": "b", "prompt": "hi"})).status == 200
    assert f.fakes["native"].models == ["a"]
    assert f.fakes["mlxlm"].models == ["/srv/models/b-4bit"]


async def test_hop_by_hop_headers_are_stripped_and_a_request_id_added(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    r = await f.client.post(
        "/v1/chat/completions",
        json=chat(),
        headers={"TE": "trailers", "Proxy-Authorization": "x", "X-Drop-Me": "1", "Connection": "X-Drop-Me", "X-Keep": "yes"},
    )
    assert r.status == 200
    sent = {k.lower(): v for k, v in f.fakes["w1"].last_headers.items()}
    assert "te" not in sent and "proxy-authorization" not in sent and "x-drop-me" not in sent
    assert sent["x-keep"] == "yes"
    assert sent["x-request-id"] == r.headers["X-Request-Id"]
    r = await f.client.post("/v1/chat/completions", json=chat(), headers={"X-Request-Id": "abc-123"})
    assert r.headers["X-Request-Id"] == "abc-123"


async def test_one_structured_log_line_per_request(make_fleet, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}})
    await f.client.post("/v1/chat/completions", json=chat())
    await f.client.post("/v1/chat/completions", json=chat(model="zzz"))
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith('{"event": "request"')]
    assert len(lines) == 2
    ok, missing = lines
    assert (ok["model"], ok["worker"], ok["status"]) == ("m", "w1", 200)
    assert ok["queue_wait_ms"] >= 0 and ok["duration_ms"] >= ok["queue_wait_ms"]
    assert (missing["status"], missing["code"], missing["model"]) == (404, "model_not_found", "-")


async def test_a_workers_refusal_is_logged_with_its_code_and_not_counted_as_the_proxys(make_fleet, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}})
    r = await f.client.post("/v1/chat/completions", json=chat(status=400, code="context_length_exceeded"))
    assert r.status == 400
    await f.client.post("/v1/messages", json=chat(status=400))
    chat_line, messages_line = [json.loads(m) for r in caplog.records if (m := r.getMessage()).startswith('{"event": "request"')]
    assert (chat_line["status"], chat_line["code"], chat_line["worker"]) == (400, "context_length_exceeded", "w1")
    assert (messages_line["status"], messages_line["code"]) == (400, "invalid_request_error")  # Anthropic's shape has a type, no code
    assert "mtpstack_proxy_refusals_total{" not in await (await f.client.get("/metrics")).text()


async def test_models_health_and_metrics_endpoints(make_fleet):
    f = await make_fleet({"a1": {"gate": 2, "model": "a"}, "b1": {"gate": 1, "model": "b"}})
    models = await (await f.client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["a", "b"]
    assert (await f.client.get("/healthz")).status == 200
    ready = await f.client.get("/readyz")
    assert ready.status == 200 and (await ready.json())["ready"] is True
    await f.client.post("/v1/chat/completions", json=chat(model="a"))
    text = await (await f.client.get("/metrics")).text()
    for needle in (
        'mtpstack_proxy_requests_total{model="a",status="200"} 1.0',
        'mtpstack_proxy_queue_depth{model="b"} 0.0',
        'mtpstack_proxy_queue_wait_seconds_count{model="a"} 1.0',
        'mtpstack_proxy_inflight{worker="a1"} 0.0',
        'mtpstack_proxy_gate{worker="a1"} 2.0',
        'mtpstack_proxy_upstream_first_byte_seconds_count{worker="a1"} 1.0',
        'mtpstack_proxy_worker_healthy{worker="b1"} 1.0',
    ):
        assert needle in text, needle


async def test_a_proxy_bug_mid_stream_still_ends_the_stream_and_frees_the_slot(make_fleet, monkeypatch, caplog):
    from mtpstack.proxy.upstream import UpstreamResponse

    real = UpstreamResponse._available
    calls = 0

    def flaky(self):
        nonlocal calls
        data = real(self)
        if self.content_type == "text/event-stream" and data:
            calls += 1
            if calls == 2:
                raise RuntimeError("injected")
        return data

    monkeypatch.setattr(UpstreamResponse, "_available", flaky)
    f = await make_fleet({"w1": {"gate": 1}})
    r = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=5, interval=0.02))
    body = await r.read()
    last = [e for e in body.split(b"\n\n") if e][-1]
    assert json.loads(last.removeprefix(b"data: "))["error"]["code"] == "internal_error"
    assert f.state.upstreams["w1"].inflight == 0
    assert "injected" in caplog.text


async def test_a_client_that_stops_reading_stops_the_worker_too(make_fleet):
    """Backpressure: the proxy holds a bounded amount of a stream, so a stalled client stalls
    the worker's writes instead of the proxy buffering the whole answer."""
    f = await make_fleet({"w1": {"gate": 1}})
    chunks, pad = 4000, 10_000  # 40 MB: more than every socket buffer on the way can hold
    r = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=chunks, pad=pad))
    await r.content.readexactly(1000)
    # Wait until the worker's writes stop advancing, then check it is stuck well short of the end.
    last = -1
    while f.fakes["w1"].chunks_written != last:
        last = f.fakes["w1"].chunks_written
        await asyncio.sleep(0.2)
    assert f.fakes["w1"].active == 1 and last < chunks // 2, f"worker wrote {last} of {chunks} chunks"
    body = await r.read()  # reading again lets the rest through, intact
    assert body.endswith(b"data: [DONE]\n\n") and body.count(b"\ndata: ") + 1 >= chunks
    assert f.fakes["w1"].chunks_written == chunks


async def test_an_http10_client_gets_the_stream_unchunked(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    body = json.dumps(chat(stream=True, chunks=20, interval=0.002)).encode()
    reader, writer = await asyncio.open_connection(f.client.server.host, f.client.server.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    answer = await reader.read()  # HTTP/1.0: the body ends when the connection does
    writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"transfer-encoding" not in head.lower()
    assert payload.count(b"data: ") == 21 and payload.endswith(b"data: [DONE]\n\n")


async def test_responses_are_forwarded_to_native_workers_through_the_same_gate(make_fleet):
    f = await make_fleet({"native": {"gate": 1, "model": "a"}})
    r = await f.client.post("/v1/responses", json={"model": "a", "input": "hi"})
    assert r.status == 200 and f.fakes["native"].models == ["a"]
    assert (await f.client.post("/v1/responses", json={"model": "zzz", "input": "hi"})).status == 404


async def test_responses_for_an_mlx_lm_backend_are_a_400_naming_the_backend(make_fleet):
    f = await make_fleet({"mlxlm": {"gate": 1, "model": "b", "backend": "mlx-lm", "target": "/srv/models/b-4bit"}})
    r = await f.client.post("/v1/responses", json={"model": "b", "input": "hi"})
    body = await r.json()
    assert r.status == 400 and body["error"]["code"] == "unsupported_endpoint"
    assert "`mlx-lm` backend" in body["error"]["message"] and "`/v1/chat/completions`" in body["error"]["message"]
    assert f.fakes["mlxlm"].models == []


@pytest.mark.parametrize("field", [{"tool_choice": "required"}, {"tool_choice": {"type": "function", "function": {"name": "f"}}},
                                   {"response_format": {"type": "json_object"}}])
async def test_fields_an_mlx_lm_backend_would_ignore_are_a_400_naming_the_backend(make_fleet, field):
    f = await make_fleet({"mlxlm": {"gate": 1, "model": "b", "backend": "mlx-lm", "target": "/srv/models/b-4bit"}})
    r = await f.client.post("/v1/chat/completions", json={"model": "b", "messages": [{"role": "user", "content": "x"}], **field})
    body = await r.json()
    assert r.status == 400 and body["error"]["code"] == "unsupported_parameter"
    assert f"`{next(iter(field))}`" in body["error"]["message"] and "`mlx-lm` backend" in body["error"]["message"]
    ok = await f.client.post("/v1/chat/completions", json={"model": "b", "messages": [{"role": "user", "content": "x"}],
                                                           "tool_choice": "auto", "response_format": {"type": "text"}})
    assert ok.status == 200 and f.fakes["mlxlm"].models == ["/srv/models/b-4bit"]
