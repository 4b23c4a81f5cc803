"""Both services' last line of defence (`errors_as_json`): an unexpected exception in a handler is a
500 in OpenAI's error shape that names the request id, logged once with its traceback, never
aiohttp's "Server got itself in trouble" in plain text."""

from __future__ import annotations

import importlib

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
