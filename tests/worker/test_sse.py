"""Server-sent events: one framing for every streaming answer of the worker."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

from aiohttp import web

import mtpstack.worker
from mtpstack.validator import FleetConfig
from mtpstack.worker.sse import DONE, KEEPALIVE, PING, frame, keepalive, open_stream

WORKER = Path(mtpstack.worker.__file__).parent


def test_an_event_is_one_data_line_of_json_then_a_blank_line():
    payload = {"id": "chatcmpl-1", "choices": [{"delta": {"content": "é\n"}}]}
    assert frame(payload) == b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_a_named_event_puts_its_name_on_an_event_line_before_the_data():
    payload = {"type": "response.created", "sequence_number": 0}
    assert frame(payload, event=payload["type"]) == b"event: response.created\ndata: " + json.dumps(payload).encode() + b"\n\n"


def test_a_stream_ends_with_the_done_marker():
    assert DONE == b"data: [DONE]\n\n"


def test_no_other_worker_module_frames_an_event_itself():
    # A `data:` written anywhere else would be a second framing that can drift from this one.
    framing = []
    for path in WORKER.rglob("*.py"):
        if path.name == "sse.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
                if text.lstrip().startswith(("data: ", "event: ")):
                    framing.append(f"{path.relative_to(WORKER)}:{node.lineno}")
    assert framing == []


# -- keep-alive comments ---------------------------------------------------------------------
#: A prefill of this long with nothing to send; the beat comes far more often.
SILENCE_SECONDS = 0.6
BEAT_SECONDS = 0.05


async def _slow_start(request):
    """A stream that opens, says nothing for a while (a long prefill), then answers two events."""
    resp = await open_stream(request, "rid-1")
    async with keepalive(resp, every=BEAT_SECONDS):
        await asyncio.sleep(SILENCE_SECONDS)
        await resp.write(frame({"n": 1}))
        await resp.write(frame({"n": 2}))
    await resp.write(DONE)
    await resp.write_eof()
    return resp


async def _pinging(request):
    """The same silence on an Anthropic stream: `ping` events, not comments."""
    resp = await open_stream(request, "rid-2")
    async with keepalive(resp, every=BEAT_SECONDS, beat=PING):
        await asyncio.sleep(SILENCE_SECONDS)
        await resp.write(frame({"type": "message_stop"}, event="message_stop"))
    await resp.write_eof()
    return resp


async def _healthy(request):
    return web.json_response({"status": "ok"})


def _events(body: bytes) -> list[bytes]:
    return [part for part in body.split(b"\n\n") if part]


async def test_a_silent_stream_sends_comment_lines_between_whole_events_that_clients_skip(aiohttp_client):
    from openai._streaming import SSEDecoder

    app = web.Application()
    app.router.add_get("/", _slow_start)
    client = await aiohttp_client(app)
    body = await (await client.get("/")).read()
    parts = _events(body)
    assert parts[0] == KEEPALIVE.rstrip(b"\n") and parts.count(KEEPALIVE.rstrip(b"\n")) >= 2
    # Comments only ever stand between whole events.
    assert all(p == KEEPALIVE.rstrip(b"\n") or p.startswith(b"data: ") for p in parts)
    # The official client's parser sees the data events alone.
    decoded = [e.data for e in SSEDecoder().iter_bytes(iter([body]))]
    assert decoded == ['{"n": 1}', '{"n": 2}', "[DONE]"]


async def test_the_proxy_relays_a_long_prefill_past_its_idle_timeout_when_the_worker_beats(aiohttp_server, aiohttp_client):
    from mtpstack.proxy import create_app

    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", _slow_start)
    upstream.router.add_get("/health", _healthy)
    server = await aiohttp_server(upstream)
    idle = SILENCE_SECONDS / 3  # the silence alone would be cut three times over
    config = FleetConfig.model_validate({
        "proxy": {"port": 1, "modelConcurrencyLimits": {"m": 1}, "timeouts": {"idleSeconds": idle}},
        "workers": {"w": {"model": "m", "target": {"path": "/models/m", "bits": 4}, "maxNumSeqs": 1,
                          "host": "127.0.0.1", "port": server.port}},
    })
    proxy = await aiohttp_client(create_app(config, health_interval=60, fleet_interval=60))
    resp = await proxy.post("/v1/chat/completions", json={"model": "m", "messages": [], "stream": True})
    body = await resp.read()
    assert resp.status == 200
    assert [p for p in _events(body) if p.startswith(b"data: ")] == [b'data: {"n": 1}', b'data: {"n": 2}', b"data: [DONE]"]
    assert b"upstream_timeout" not in body


async def test_a_silent_anthropic_stream_sends_ping_events(aiohttp_client):
    app = web.Application()
    app.router.add_get("/", _pinging)
    client = await aiohttp_client(app)
    parts = _events(await (await client.get("/")).read())
    assert PING == b'event: ping\ndata: {"type": "ping"}\n\n'
    assert parts.count(PING.rstrip(b"\n")) >= 2 and parts[-1].startswith(b"event: message_stop")
