"""Both services' last line of defence (`errors_as_json`): an unexpected exception in a handler is a
500 in OpenAI's error shape that names the request id, logged once with its traceback, never
aiohttp's "Server got itself in trouble" in plain text."""

from __future__ import annotations

import asyncio
import importlib
import logging

import pytest
from aiohttp import web


@pytest.mark.parametrize("module", ["mtpstack.worker.http", "mtpstack.proxy.http"])
async def test_an_unexpected_exception_is_a_json_500_with_the_request_id_logged_once(aiohttp_client, caplog, module):
    async def broken(request):
        raise RuntimeError("a bug")

    app = web.Application(middlewares=[importlib.import_module(module).errors_as_json])
    app.router.add_get("/broken", broken)
    client = await aiohttp_client(app)
    resp = await client.get("/broken", headers={"X-Request-Id": "rid-500"})
    payload = await resp.json()
    assert (resp.status, payload["error"]["code"], resp.headers["X-Request-Id"]) == (500, "internal_error", "rid-500")
    assert "rid-500" in payload["error"]["message"] and "a bug" not in payload["error"]["message"]
    [record] = [r for r in caplog.records if r.exc_info]
    assert "rid-500" in record.getMessage()


async def test_a_failure_after_the_answer_began_cuts_the_connection_and_is_logged_once(aiohttp_client, caplog):
    # A second answer cannot follow the first's bytes: the worker cuts the stream (an OpenAI client
    # raises on the short stream) instead of letting aiohttp log the failure again on its own.
    from mtpstack.worker.http import errors_as_json

    async def breaks_mid_stream(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"data: {}\n\n")
        raise RuntimeError("a bug")

    app = web.Application(middlewares=[errors_as_json])
    app.router.add_get("/stream", breaks_mid_stream)
    client = await aiohttp_client(app)
    resp = await client.get("/stream", headers={"X-Request-Id": "rid-cut"})
    assert resp.status == 200
    with pytest.raises(Exception):  # the body ends before its chunked terminator
        await resp.read()
    await asyncio.sleep(0.05)  # anything aiohttp would log on its own, it has logged by now
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == ["request rid-cut: unexpected error"]
