"""Two real workers of one model (tiny models) behind the proxy, one killed with SIGKILL: the requests
that find it dead are answered by the other, never with a 502, though no health check has noticed
yet; a stream it was answering ends, through the official openai client, in the API's error."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from mtpstack.proxy import STATE
from mtpstack.proxy.app import create_app
from mtpstack.proxy.prometheus import parse_samples, sample
from mtpstack.validator import FleetConfig
from tests.e2e.conftest import Workers, fleet, running_workers
from tests.e2e.test_routing import client, served, wait_for

#: Long enough to be cut after its first chunks, within the tiny target's 512-token context.
STREAM_TOKENS = 400
#: Requests sent at once after the kill: more than the survivor's gate, so some wait in line.
AFTER_KILL = 8


@pytest.fixture(scope="module")
def workers(tiny_pair, tmp_path_factory):
    with running_workers(fleet(*tiny_pair, width=2, workers=2), tmp_path_factory.mktemp("failover")) as w:
        yield w


async def alive_again(workers: Workers) -> None:
    """Both workers running (one killed by an earlier test is started again)."""
    for name, proc in workers.procs.items():
        if not proc.alive():
            await asyncio.to_thread(workers.start, name)
    await asyncio.to_thread(workers.wait_healthy)


async def started_proxy(workers: Workers, health_interval: float) -> TestServer:
    server = TestServer(create_app(FleetConfig.model_validate(workers.data), health_interval=health_interval, fleet_interval=60))
    await server.start_server()
    state = server.app[STATE]
    await wait_for(lambda: all(u.healthy for u in state.upstreams.values()), "both workers healthy at the proxy")
    return server


async def metrics_of(server: TestServer) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.make_url("/metrics")) as r:
            return parse_samples(await r.text())


async def killed(workers: Workers, name: str) -> None:
    proc = workers.procs[name]
    proc.kill()
    await asyncio.to_thread(proc.wait, 10)


async def test_after_one_of_two_workers_is_killed_no_request_sees_a_502(workers, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    await alive_again(workers)
    # Health checks a minute apart: only the requests themselves can find the dead worker.
    server = await started_proxy(workers, health_interval=60)
    try:
        api = client(server)
        history = [{"role": "user", "content": "task k: add a test"}]
        first = await api.chat.completions.create(model="tiny", messages=history, max_tokens=8, temperature=0,
                                                  extra_body={"prompt_cache_key": "conv-k"}, extra_headers={"X-Request-Id": "k-1"})
        assert served(caplog, "k-1")[0] == "w0"  # both idle: the first in config order, remembered for conv-k
        await api.completions.create(model="tiny", prompt="def f(x):", max_tokens=4)  # a kept-alive connection to w0
        await killed(workers, "w0")
        state = server.app[STATE]
        assert state.upstreams["w0"].healthy  # nobody has noticed yet

        history += [{"role": "assistant", "content": first.choices[0].message.content or "ok"}, {"role": "user", "content": "next"}]
        second = await api.chat.completions.create(model="tiny", messages=history, max_tokens=8, temperature=0,
                                                   extra_body={"prompt_cache_key": "conv-k"}, extra_headers={"X-Request-Id": "k-2"})
        assert second.choices[0].message.role == "assistant"
        assert served(caplog, "k-2")[0] == "w1" and not state.upstreams["w0"].healthy
        lines = [json.loads(r.getMessage()) for r in caplog.records if '"request_id": "k-2"' in r.getMessage()]
        assert [line.get("failed_over") for line in lines if line["event"] == "request"] == [["w0"]]

        async def one(i: int) -> str:
            if i % 3 == 0:
                r = await api.completions.create(model="tiny", prompt=f"def g{i}(x):", max_tokens=8, temperature=0)
                return r.choices[0].text
            if i % 3 == 1:
                stream = await api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"q{i}"}],
                                                           max_tokens=8, stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            r = await api.responses.create(model="tiny", input=f"q{i}", max_output_tokens=8)
            return r.status

        # Any 502 (or other error) would raise here: the client does not retry (max_retries=0).
        await asyncio.gather(*(one(i) for i in range(AFTER_KILL)))
        metrics = await metrics_of(server)
        assert sample(metrics, "mtpstack_proxy_failovers_total", worker="w0") >= 1
    finally:
        await server.close()
    statuses = [json.loads(r.getMessage())["status"] for r in caplog.records
                if r.getMessage().startswith('{"event": "request"')]
    assert 502 not in statuses and set(statuses) == {200}, statuses


@pytest.mark.parametrize("api", ["chat", "completions", "responses"])
async def test_a_stream_the_killed_worker_was_answering_ends_in_an_error_the_openai_client_sees(workers, caplog, api):
    import openai

    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    await alive_again(workers)
    server = await started_proxy(workers, health_interval=0.2)
    try:
        c = client(server)
        extra = {"extra_body": {"ignore_eos": True}, "extra_headers": {"X-Request-Id": f"cut-{api}"}, "temperature": 0}
        if api == "chat":
            stream = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "count"}],
                                                     max_tokens=STREAM_TOKENS, stream=True, **extra)
        elif api == "completions":
            stream = await c.completions.create(model="tiny", prompt="def fib(n):", max_tokens=STREAM_TOKENS, stream=True, **extra)
        else:
            stream = await c.responses.create(model="tiny", input="count", max_output_tokens=STREAM_TOKENS, stream=True, **extra)
        state = server.app[STATE]
        events, error = [], None
        try:
            async for event in stream:
                events.append(event)
                if len(events) == 3:
                    holder = next(u.name for u in state.upstreams.values() if u.inflight)
                    await killed(workers, holder)
        except openai.APIError as e:
            error = e
        if api == "responses":
            assert error is None and events[-1].type == "error", events[-3:]
            assert (events[-1].code, events[-1].sequence_number) == ("upstream_disconnected", events[-2].sequence_number + 1)
        else:
            assert error is not None and error.code == "upstream_disconnected", (error, events[-3:])
            assert "closed the connection mid-stream" in error.message
        assert len(events) < STREAM_TOKENS  # cut, not finished
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and f"cut-{api}" in r.getMessage()]
        assert len(warnings) == 1 and holder in warnings[0], warnings
        metrics = await metrics_of(server)
        assert sample(metrics, "mtpstack_proxy_refusals_total", model="tiny", code="upstream_disconnected") == 1
    finally:
        await server.close()
