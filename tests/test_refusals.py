"""Both services' last line of defence (`mtpstack.web.errors_as_json`): an unexpected exception in a
handler is a 500 in OpenAI's error shape that names the request id, logged once with its traceback,
never aiohttp's "Server got itself in trouble" in plain text, and one after the answer began cuts its
connection; and the one error body and status rule (`mtpstack.refusals`) both services answer with."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web

from mtpstack.web import errors_as_json


async def broken(request):
    raise RuntimeError("a bug")


async def client_of(aiohttp_client, service: str, method: str, path: str):
    """A client of an app behind the service's `errors_as_json`, whose only route fails."""
    app = web.Application(middlewares=[errors_as_json(service)])
    app.router.add_route(method, path, broken)
    return await aiohttp_client(app)


@pytest.mark.parametrize("service", ["worker", "proxy"])
async def test_an_unexpected_exception_is_a_json_500_with_the_request_id_logged_once(aiohttp_client, caplog, service):
    client = await client_of(aiohttp_client, service, "GET", "/broken")
    resp = await client.get("/broken", headers={"X-Request-Id": "rid-500"})
    payload = await resp.json()
    assert (resp.status, payload["error"]["code"], resp.headers["X-Request-Id"]) == (500, "internal_error", "rid-500")
    assert "rid-500" in payload["error"]["message"] and "a bug" not in payload["error"]["message"]
    assert f"the {service} failed" in payload["error"]["message"]
    [record] = [r for r in caplog.records if r.exc_info]
    assert record.getMessage() == "unexpected error in request rid-500" and record.name == f"mtpstack.{service}"


async def breaks_mid_stream(request):
    resp = web.StreamResponse()
    await resp.prepare(request)
    await resp.write(b"data: {}\n\n")
    raise RuntimeError("a bug")


@pytest.mark.parametrize("service", ["worker", "proxy"])
async def test_a_failure_after_the_answer_began_cuts_the_connection_and_is_logged_once(aiohttp_client, caplog, service):
    # A second answer cannot follow the first's bytes: the service cuts the stream (an OpenAI client
    # raises on the short stream) instead of letting aiohttp log the failure again on its own.
    app = web.Application(middlewares=[errors_as_json(service)])
    app.router.add_get("/stream", breaks_mid_stream)
    client = await aiohttp_client(app)
    resp = await client.get("/stream", headers={"X-Request-Id": "rid-cut"})
    assert resp.status == 200
    with pytest.raises(Exception):  # the body ends before its chunked terminator
        await resp.read()
    await asyncio.sleep(0.05)  # anything aiohttp would log on its own, it has logged by now
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == ["unexpected error in request rid-cut"]


async def test_the_proxy_cuts_the_connection_of_an_answer_that_broke_after_its_first_bytes(caplog):
    """The proxy's own app, its middlewares as it builds them, on a real server on loopback, read by a
    real client: a handler that fails mid-answer cuts the connection, logged once, as the worker does."""
    from mtpstack.proxy.app import create_app
    from mtpstack.validator import FleetConfig

    app = create_app(FleetConfig())
    app.router.add_get("/broken-stream", breaks_mid_stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{host}:{port}/broken-stream", headers={"X-Request-Id": "rid-proxy"}) as resp:
                assert resp.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):  # the body ends before its chunked terminator
                    await resp.read()
        await asyncio.sleep(0.05)  # anything aiohttp would log on its own, it has logged by now
    finally:
        await runner.cleanup()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [(r.name, r.getMessage(), r.exc_info is not None) for r in errors] == [
        ("mtpstack.proxy", "unexpected error in request rid-proxy", True)]


# -- one error body, one status rule -----------------------------------------------------

#: The OpenAI `type` each service answered before the rule moved to the base: the worker's
#: `invalid_request_error` below 500 (its 429 by hand), the proxy's map, which agreed on these.
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
                429: "rate_limit_error", 500: "server_error", 502: "server_error", 503: "server_error",
                504: "server_error"}


@pytest.mark.parametrize(("status", "type_"), sorted(OPENAI_TYPES.items()))
def test_both_services_answer_a_status_with_one_openai_type(status, type_):
    from mtpstack.web import error_response
    from mtpstack.worker.http import ApiError

    worker = ApiError(status, "c", "m", "p").response("rid")
    proxy = error_response(status, "c", "m", rid="rid")
    assert json.loads(worker.body)["error"] == {"message": "m", "type": type_, "code": "c", "param": "p"}
    assert json.loads(proxy.body)["error"] == {"message": "m", "type": type_, "code": "c", "param": None}


@pytest.mark.parametrize("service", ["worker", "proxy"])
async def test_a_new_api_family_is_one_renderer_both_middlewares_answer_its_endpoints_with(aiohttp_client, monkeypatch, service):
    """How issue 35 adds Anthropic's shape: a row whose family has a renderer and a column of types."""
    from mtpstack import endpoints, refusals

    monkeypatch.setitem(refusals.ERROR_TYPES, "other", {**refusals.ERROR_TYPES["openai"], "server": "api_error",
                                                         "not_found": "not_found_error"})
    monkeypatch.setitem(refusals.ERROR_BODIES, "other", lambda status, code, message, param: {
        "type": "error", "error": {"type": refusals.error_type(status, "other"), "message": message}})
    row = endpoints.Endpoint("/v1/other", "chat", "Other API", units="messages", family="other")
    monkeypatch.setitem(endpoints.BY_PATH, row.path, row)
    client = await client_of(aiohttp_client, service, "POST", "/v1/other")
    resp = await client.post("/v1/other", headers={"X-Request-Id": "rid-other"})
    payload = await resp.json()
    assert resp.status == 500 and payload["type"] == "error" and payload["error"]["type"] == "api_error"
    assert "rid-other" in payload["error"]["message"]
    wrong_method = await client.get("/v1/other")
    assert (wrong_method.status, (await wrong_method.json())["error"]["type"]) == (405, "invalid_request_error")
    # Any other path keeps OpenAI's shape.
    missing = await client.get("/nowhere")
    assert (await missing.json())["error"]["code"] == "not_found"


def test_a_long_model_name_is_echoed_cut_the_same_way_by_both_services():
    from mtpstack.proxy.intake import not_served
    from mtpstack.refusals import SHOWN_NAME
    from mtpstack.worker.http import model_not_found

    name = "m" * 5000
    shown = "m" * SHOWN_NAME + "..."
    assert f"not: `{shown}`" in model_not_found("served", name).message
    assert f"model `{shown}` is not served" in not_served(SimpleNamespace(admissions={"a": None}), name)


def test_a_failed_stream_ends_in_its_apis_shape_a_responses_error_event_numbered_after_the_last():
    from mtpstack.refusals import error_body, stream_error

    assert stream_error("responses", 502, "upstream_disconnected", "gone", 7) == (
        "error", {"type": "error", "sequence_number": 7, "code": "upstream_disconnected", "message": "gone", "param": None})
    for api in ("chat", "completions"):
        assert stream_error(api, 502, "upstream_disconnected", "gone") == (None, error_body(502, "upstream_disconnected", "gone"))
    assert stream_error("messages", 502, "upstream_disconnected", "gone", family="anthropic") == (
        "error", error_body(502, "upstream_disconnected", "gone", family="anthropic"))
