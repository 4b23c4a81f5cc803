"""A stream the client read to its final event is a delivered answer, even when the client closes
the connection before the worker's stream has ended (agent clients stop reading at `[DONE]`,
`response.completed` or `message_stop` and close at once); a client gone before that event is a 499.
Real fake workers on loopback that linger after their final event, the proxy app, an aiohttp client."""

from __future__ import annotations

import logging

import pytest

from mtpstack.proxy.prometheus import labelled
from tests.proxy.test_failover import metrics_of, request_lines
from tests.proxy.test_proxy import chat, eventually

#: The worker keeps the stream open this long after its final event: the client is long gone by then.
LINGER = 0.3

FAMILIES = {
    "chat": ("/v1/chat/completions", b"data: [DONE]"),
    "responses": ("/v1/responses", b"event: response.completed"),
    "messages": ("/v1/messages", b"event: message_stop"),
}


async def read_to(r, final: bytes) -> bytes:
    """Read events until the one starting with `final` (as Codex, Claude Code and the SDKs do), then close."""
    while True:
        event = await r.content.readuntil(b"\n\n")
        assert event.endswith(b"\n\n"), f"the stream ended before its final event: {event!r}"
        if event.startswith(final):
            r.close()  # no read past the final event: the connection goes at once
            return event


async def statuses(f) -> dict[str, float]:
    """`mtpstack_proxy_requests_total` of model `m`, by status."""
    return {labels["status"]: n for labels, n in labelled(await metrics_of(f.client), "mtpstack_proxy_requests_total")
            if labels.get("model") == "m" and n}


async def one_logged(f, caplog) -> dict:
    await eventually(lambda: request_lines(caplog), what="the request's log line")
    (line,) = request_lines(caplog).values()
    return line


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_client_that_closes_right_after_the_final_event_is_counted_as_answered(make_fleet, caplog, family):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}})
    path, final = FAMILIES[family]
    r = await f.client.post(path, json=chat(stream=True, chunks=3, linger=LINGER))
    assert r.status == 200
    await read_to(r, final)
    line = await one_logged(f, caplog)
    assert (line["status"], line["code"]) == (200, None)
    assert await statuses(f) == {"200": 1}
    assert f.state.upstreams["w1"].inflight == 0


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_final_event_that_arrives_in_pieces_counts_once_whole(make_fleet, caplog, family):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}})
    path, final = FAMILIES[family]
    # 3 pieces 20 ms apart: the proxy reads and writes each on its own; a 300 kB Responses event is
    # larger than one socket read besides.
    pad = 300_000 if family == "responses" else 0
    r = await f.client.post(path, json=chat(stream=True, chunks=3, linger=LINGER, split=3, final_pad=pad))
    event = await read_to(r, final)
    assert len(event) > pad
    line = await one_logged(f, caplog)
    assert (line["status"], line["code"]) == (200, None)
    assert await statuses(f) == {"200": 1}


async def test_the_worker_still_streaming_after_the_final_event_sees_the_client_go_and_its_connection_is_not_reused(make_fleet, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}})
    r = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=3, linger=LINGER))
    await read_to(r, b"data: [DONE]")
    # The proxy dropped the worker's connection half-read (its chunk terminator still to come), as for
    # any client that leaves: the worker's handler is cancelled, not left writing to nobody.
    await eventually(lambda: f.fakes["w1"].cancelled == 1, what="the worker seeing the client go")
    # A half-read connection put back in the pool would hand the next answer the last one's tail.
    again = await f.client.post("/v1/chat/completions", json=chat(stream=True, chunks=2))
    body = await again.read()
    assert again.status == 200 and body.count(b"data: ") == 3 and body.endswith(b"data: [DONE]\n\n")
    assert await statuses(f) == {"200": 2}


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_client_that_leaves_before_the_final_event_is_still_a_499(make_fleet, caplog, family):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}})
    path, final = FAMILIES[family]
    r = await f.client.post(path, json=chat(stream=True, chunks=50, interval=0.02, linger=LINGER))
    first = await r.content.readuntil(b"\n\n")
    assert not first.startswith(final)
    r.close()  # mid-stream: 49 events and the final one still to come
    line = await one_logged(f, caplog)
    assert (line["status"], line["code"]) == (499, "client_closed")
    assert await statuses(f) == {"499": 1}
    await eventually(lambda: f.fakes["w1"].cancelled == 1, what="the worker seeing the client go")


async def test_a_client_that_leaves_inside_the_final_event_is_still_a_499(make_fleet, caplog):
    """Half an event is no event: a client that saw `response.completed`'s name but not its data
    did not get the answer."""
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}})
    r = await f.client.post("/v1/responses", json=chat(stream=True, chunks=2, split=2, linger=LINGER, final_pad=1000))
    for _ in range(2):
        await r.content.readuntil(b"\n\n")
    head = await r.content.readuntil(b"\n")
    assert head == b"event: response.completed\n"
    r.close()  # the second half of the final event is 20 ms away
    line = await one_logged(f, caplog)
    assert (line["status"], line["code"]) == (499, "client_closed")
    assert await statuses(f) == {"499": 1}
