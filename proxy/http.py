"""HTTP policy of the proxy: which headers cross it, how errors look (the body is both services'
one, `mtpstack.refusals`, in the shape of the endpoint's API family).

Request ids are both services' convention: `mtpstack.requestid`.
"""

from __future__ import annotations

import json
import logging
import re
from http import HTTPStatus
from typing import Iterable

from aiohttp import hdrs, web

from mtpstack.endpoints import Endpoint, family_of
from mtpstack.refusals import error_body, family_status, internal_error, routing_refusal, stream_error
from mtpstack.requestid import REQUEST_ID, request_id
from mtpstack.usage import USAGE_HEADER

log = logging.getLogger("mtpstack.proxy")

#: Hop-by-hop headers (RFC 9110 section 7.6.1): they describe one connection, so they never
#: cross the proxy; headers named in `Connection` are dropped with them.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        hdrs.CONNECTION, hdrs.KEEP_ALIVE, hdrs.PROXY_AUTHENTICATE, hdrs.PROXY_AUTHORIZATION,
        hdrs.TE, hdrs.TRAILER, hdrs.TRANSFER_ENCODING, hdrs.UPGRADE, "Proxy-Connection",
    )
)
#: Request headers the proxy sets itself or keeps to itself: the length is recomputed, the
#: host is the worker's, and API keys are for the proxy only (workers never see them).
REQUEST_DROP = HOP_BY_HOP | {
    h.lower() for h in (hdrs.HOST, hdrs.CONTENT_LENGTH, hdrs.AUTHORIZATION, "X-Api-Key", REQUEST_ID, hdrs.EXPECT, USAGE_HEADER)
}
#: Response headers aiohttp writes itself for the client connection.
RESPONSE_DROP = HOP_BY_HOP | {h.lower() for h in (hdrs.CONTENT_LENGTH, hdrs.DATE, hdrs.SERVER, REQUEST_ID)}

def filter_headers(headers: Iterable[tuple[str, str]], drop: frozenset[str] | set[str]) -> list[tuple[str, str]]:
    """The end-to-end headers of `headers`: without `drop` and without those `Connection` names."""
    kept, named = [], set()
    for k, v in headers:
        low = k.lower()
        if low == "connection":
            named.update(t.strip().lower() for t in v.split(","))
        if low not in drop:
            kept.append((k, v, low))
    return [(k, v) for k, v, low in kept if low not in named] if named else [(k, v) for k, v, _ in kept]


def error_response(
    status: HTTPStatus, code: str, message: str, *, rid: str, retry_after: int | None = None, family: str = "openai"
) -> web.Response:
    """A refusal of the proxy's own, in the error shape of the endpoint's API family (`mtpstack.refusals`)."""
    headers = {REQUEST_ID: rid}
    if retry_after is not None:
        headers[hdrs.RETRY_AFTER] = str(retry_after)
    status = family_status(status, code, family)
    return web.Response(
        status=status,
        body=json.dumps(error_body(status, code, message, family=family)).encode(),
        content_type="application/json",
        headers=headers,
    )


#: The Responses API's stream events carry a running `sequence_number`.
_SEQUENCE_NUMBER = re.compile(rb'"sequence_number": ?(\d+)')


def sse_error_event(code: str, message: str, endpoint: Endpoint | None = None, last: bytes = b"") -> bytes:
    """The last event of a stream the proxy had to cut short, in its endpoint's API's shape
    (`mtpstack.refusals.stream_error`): Chat Completions and Completions `data: {"error": {...}}`, on
    which OpenAI clients raise; Messages Anthropic's `event: error`; Responses an `error` event
    numbered after the last one in `last` (what the worker sent last)."""
    api, family = (endpoint.api, endpoint.family) if endpoint is not None else ("chat", "openai")
    seen = [int(n) for n in _SEQUENCE_NUMBER.findall(last)] if api == "responses" else ()
    name, data = stream_error(api, HTTPStatus.BAD_GATEWAY, code, message, max(seen, default=-1) + 1, family)
    return (f"event: {name}\n".encode() if name else b"") + b"data: " + json.dumps(data).encode() + b"\n\n"


@web.middleware
async def errors_as_json(request: web.Request, handler) -> web.StreamResponse:
    """The proxy's own refusals in the error shape too: an unknown path or a wrong method
    (aiohttp's plain-text 404 and 405), and an unexpected exception outside `forward` (which
    answers its own), a 500 naming the request id, logged once with its traceback."""
    try:
        resp = await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code, message = routing_refusal(e.status, request.method, request.path, e.headers.get(hdrs.ALLOW))
        extra = {hdrs.ALLOW: e.headers[hdrs.ALLOW]} if hdrs.ALLOW in e.headers else {}
        status = HTTPStatus(e.status)
        rid = request_id(request.headers)  # a client's id, or a new one: minted only for a refusal here
    except Exception:
        rid = request_id(request.headers)
        log.exception("unexpected error in request %s", rid)
        (code, message), extra, status = internal_error("proxy", rid), {}, HTTPStatus.INTERNAL_SERVER_ERROR
    else:
        return resp
    resp = error_response(status, code, message, rid=rid, family=family_of(request.path))
    resp.headers.update(extra)
    return resp
