"""Server-sent events: how every streaming answer of the worker opens its stream and frames each event."""

from __future__ import annotations

import json
from http import HTTPStatus

from aiohttp import hdrs, web

from mtpstack.worker.http import REQUEST_ID

#: A stream must reach the client event by event: nothing may cache it, and nginx must not buffer it.
STREAM_HEADERS = {hdrs.CONTENT_TYPE: "text/event-stream", hdrs.CACHE_CONTROL: "no-cache", "X-Accel-Buffering": "no"}


def frame(data: dict | str, event: str | None = None) -> bytes:
    """One event: its `event:` line when named, one `data:` line (a dict as JSON), then the blank line."""
    text = data if isinstance(data, str) else json.dumps(data)
    named = f"event: {event}\n" if event is not None else ""
    return f"{named}data: {text}\n\n".encode()


#: The last event of a Chat Completions or Completions stream that ended normally.
DONE = frame("[DONE]")


async def open_stream(request: web.Request, rid: str) -> web.StreamResponse:
    """A 200 event stream for `request`, its headers sent, carrying the request's id."""
    resp = web.StreamResponse(status=HTTPStatus.OK, headers={**STREAM_HEADERS, REQUEST_ID: rid})
    await resp.prepare(request)
    return resp
