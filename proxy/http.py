"""HTTP policy of the proxy: which headers cross it, and the last event of a stream it cuts short.
Its refusals and its JSON-error middleware are both services' (`mtpstack.web`).

Request ids are both services' convention: `mtpstack.requestid`.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Iterable

from aiohttp import hdrs

from mtpstack.endpoints import Endpoint
from mtpstack.refusals import stream_error
from mtpstack.requestid import REQUEST_ID
from mtpstack.usage import USAGE_HEADER

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
