"""Failover: a request a worker never took (the connection refused, or reset before the worker read
it) goes to another worker of its model and the worker is marked unhealthy at once; a request a
worker may have read is never sent twice; a stream cut mid-answer ends in its API's error shape.
Health checks are slowed to a minute throughout: what is seen here is the request's own doing."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct

import pytest
from aiohttp.test_utils import TestServer

from devkit.fake_upstream import FakeState, make_app
from mtpstack.proxy import STATE, create_app
from mtpstack.proxy.prometheus import parse_samples, sample
from tests.proxy.conftest import fleet_config
from tests.proxy.test_proxy import chat, error_of, eventually, unaccepting_port  # noqa: F401  (a fixture)

SLOW_CHECKS = 60.0


class RawWorker:
    """A worker on a bare socket: answers `/health` (and anything else) 200 while `mode` is "answer";
    in "reset" it resets each connection without reading a byte (a process gone before it read);
    in "close after reading" it reads the whole request, then closes (it may have acted on it)."""

    def __init__(self) -> None:
        self.mode = "answer"
        self.reset_after = 0.0
        #: In "reset": when set, each connection is reset once this event is set (not after `reset_after`).
        self.reset_when: asyncio.Event | None = None
        #: Connections taken in "reset" mode.
        self.resets = 0
        self.read: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader, writer) -> None:
        try:
            if self.mode == "reset":
                self.resets += 1
                if self.reset_when is not None:
                    await self.reset_when.wait()
                await asyncio.sleep(self.reset_after)
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()  # linger 0: an RST, whatever was sent
                return
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
                           if k.strip().lower() == b"content-length"), 0)
            self.read.append(head + await reader.readexactly(length))
            if self.mode == "close after reading":
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            await writer.drain()
            writer.close()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def raw_and_fake(aiohttp_server, aiohttp_client):
    """A proxy over `w1`, a `RawWorker`, then `w2`, a fake worker; both of model `m`, gate 1."""
    raw = RawWorker()
    fake = FakeState(gate=1, name="w2")
    fake_server = await aiohttp_server(make_app(fake))
    config = fleet_config({"w1": await raw.start(), "w2": fake_server.port}, {"w1": {"gate": 1}, "w2": {"gate": 1}})
    client = await aiohttp_client(create_app(config, health_interval=SLOW_CHECKS))
    yield client, raw, fake
    raw.close()


def completions_read(raw: RawWorker) -> list[bytes]:
    """The completion requests the raw worker read (the proxy's health checks and fleet reads aside)."""
    return [r for r in raw.read if r.startswith(b"POST /v1/")]


def request_lines(caplog) -> dict[str, dict]:
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith('{"event": "request"')]
    return {line["request_id"]: line for line in lines}


async def metrics_of(client) -> dict:
    return parse_samples(await (await client.get("/metrics")).text())


async def test_a_request_a_dead_worker_refuses_goes_to_the_other_worker_which_answers_it(make_fleet, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}, "w2": {"gate": 1}}, health_interval=SLOW_CHECKS)
    await f.servers["w1"].close()  # nothing listens there any more; no health check has seen it
    assert f.state.upstreams["w1"].healthy
    r = await f.client.post("/v1/chat/completions", json=chat("first"), headers={"X-Request-Id": "r1"})
    assert r.status == 200 and f.fakes["w2"].arrivals == ["first"]
    assert not f.state.upstreams["w1"].healthy  # at once, not at the next check
    line = request_lines(caplog)["r1"]
    assert (line["worker"], line["failed_over"], line["status"]) == ("w2", ["w1"], 200)
    m = await metrics_of(f.client)
    assert sample(m, "mtpstack_proxy_failovers_total", worker="w1") == 1
    assert sample(m, "mtpstack_proxy_upstream_errors_total", worker="w1", code="upstream_unreachable") == 1
    r = await f.client.post("/v1/chat/completions", json=chat("second"))
    assert r.status == 200 and f.fakes["w2"].arrivals == ["first", "second"]  # no second try on w1


async def test_a_worker_that_resets_the_connection_before_reading_the_request_is_failed_over(raw_and_fake, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    client, raw, fake = raw_and_fake
    raw.mode = "reset"
    r = await client.post("/v1/chat/completions", json=chat("x"), headers={"X-Request-Id": "r2"})
    assert r.status == 200 and fake.arrivals == ["x"]
    assert completions_read(raw) == []
    state = client.server.app[STATE]
    assert not state.upstreams["w1"].healthy and "reset the connection" in state.upstreams["w1"].health_detail
    assert request_lines(caplog)["r2"]["failed_over"] == ["w1"]


async def test_a_worker_that_accepts_no_connection_in_time_is_failed_over(aiohttp_server, aiohttp_client, unaccepting_port, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    fake = FakeState(gate=1, name="w2")
    fake_server = await aiohttp_server(make_app(fake))
    config = fleet_config({"w1": unaccepting_port, "w2": fake_server.port}, {"w1": {"gate": 1}, "w2": {"gate": 1}},
                          proxy={"timeouts": {"connectSeconds": 0.2}})
    app = create_app(config, health_interval=SLOW_CHECKS)
    client = await aiohttp_client(app)
    state = app[STATE]
    state.admissions["m"].set_healthy(state.upstreams["w1"], True, "as if a check had just passed")
    r = await client.post("/v1/chat/completions", json=chat("slow"), headers={"X-Request-Id": "r4"})
    assert r.status == 200 and fake.arrivals == ["slow"]
    assert not state.upstreams["w1"].healthy and "did not accept a connection" in state.upstreams["w1"].health_detail
    assert request_lines(caplog)["r4"]["failed_over"] == ["w1"]


async def test_a_request_the_worker_may_have_read_is_never_sent_to_another(raw_and_fake):
    client, raw, fake = raw_and_fake
    raw.mode = "close after reading"
    r = await client.post("/v1/chat/completions", json=chat("once"))
    assert r.status == 502 and (await error_of(r))["code"] == "upstream_unreachable"
    read = completions_read(raw)
    assert len(read) == 1 and b'"once"' in read[0]
    assert fake.arrivals == []  # read by one worker: it could have been acted on


async def test_a_request_sent_back_goes_ahead_of_those_that_arrived_after_it(raw_and_fake):
    client, raw, fake = raw_and_fake
    admission = client.server.app[STATE].admissions["m"]
    raw.mode, raw.reset_when = "reset", asyncio.Event()
    sent_back = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat("B")))
    await eventually(lambda: raw.resets == 1, what="B on w1 (first in config order)")
    held = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat("A", hold="A")))
    await eventually(lambda: fake.active == 1, what="A holding w2")
    later = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat("C")))  # both full: C waits
    await eventually(lambda: admission.waiting == 1, what="C waiting")
    raw.reset_when.set()  # w1 resets B before reading it: B is sent back
    await eventually(lambda: admission.waiting == 2, what="B back in the queue")
    fake.release("A")
    statuses = [(await t).status for t in (sent_back, held, later)]
    assert statuses == [200, 200, 200]
    assert fake.arrivals == ["A", "B", "C"]  # B, back from w1, took w2 before C, which came after it


async def test_with_every_worker_refusing_the_answer_is_a_502_and_then_no_healthy_worker(make_fleet, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}, "w2": {"gate": 1}}, health_interval=SLOW_CHECKS)
    for server in f.servers.values():
        await server.close()
    r = await f.client.post("/v1/chat/completions", json=chat(), headers={"X-Request-Id": "r3"})
    assert r.status == 502 and (await error_of(r))["code"] == "upstream_unreachable"
    assert request_lines(caplog)["r3"]["failed_over"] == ["w1", "w2"]
    r = await f.client.post("/v1/chat/completions", json=chat())
    assert r.status == 503 and (await error_of(r))["code"] == "no_healthy_worker"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_stream_cut_mid_answer_ends_with_an_error_the_openai_clients_raise_on(make_fleet, caplog, path):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}}, health_interval=SLOW_CHECKS)
    r = await f.client.post(path, json=chat(stream=True, chunks=10, die_after=3), headers={"X-Request-Id": "cut"})
    events = [e for e in (await r.read()).split(b"\n\n") if e]
    assert r.status == 200 and len(events) == 4
    error = json.loads(events[-1].removeprefix(b"data: "))["error"]
    assert (error["code"], error["type"]) == ("upstream_disconnected", "server_error")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("request cut" in w and "upstream_disconnected" in w for w in warnings), warnings
    m = await metrics_of(f.client)
    assert sample(m, "mtpstack_proxy_refusals_total", model="m", code="upstream_disconnected") == 1


async def test_a_responses_stream_cut_mid_answer_ends_with_an_error_event_numbered_after_the_last(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}}, health_interval=SLOW_CHECKS)
    r = await f.client.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True,
                                                   "x_fake": {"chunks": 10, "die_after": 3}})
    events = [e for e in (await r.read()).split(b"\n\n") if e]
    assert r.status == 200 and len(events) == 4
    name, data = events[-1].split(b"\n", 1)
    assert name == b"event: error"
    error = json.loads(data.removeprefix(b"data: "))
    assert error == {"type": "error", "sequence_number": 3, "code": "upstream_disconnected",
                     "message": "worker `w1` closed the connection mid-stream", "param": None}
