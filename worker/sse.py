"""Server-sent events: how every streaming answer of the worker opens its stream and frames each event."""

from __future__ import annotations

import asyncio
import contextlib
import json
from http import HTTPStatus
from typing import AsyncIterator, Callable

from aiohttp import hdrs, web

from mtpstack.usage import USAGE_HEADER, with_usage
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


class EventStream(web.StreamResponse):
    """A stream response that knows when it last wrote (`keepalive` reads it), and, when the proxy
    asked (`mtpstack.usage`), puts the tokens used so far in a comment inside each event it writes."""

    last_write = 0.0
    #: `(prompt, cached, completion)` tokens so far, or None: no usage comment.
    usage: Callable[[], tuple[int, int, int]] | None = None

    async def write(self, data) -> None:
        self.last_write = asyncio.get_running_loop().time()
        if self.usage is not None:
            data = with_usage(bytes(data), *self.usage())
        await super().write(data)


async def open_stream(request: web.Request, rid: str, usage: Callable[[], tuple[int, int, int]] | None = None) -> EventStream:
    """A 200 event stream for `request`, its headers sent, carrying the request's id; `usage` counts
    the tokens so far, for the comment a proxy asks for with `X-Mtpstack-Usage`."""
    resp = EventStream(status=HTTPStatus.OK, headers={**STREAM_HEADERS, REQUEST_ID: rid})
    if usage is not None and request.headers.get(USAGE_HEADER) == "1":
        resp.usage = usage
    await resp.prepare(request)
    resp.last_write = asyncio.get_running_loop().time()
    return resp


#: A stream silent this long gets an SSE comment line, which every client's parser skips (the SSE
#: spec; openai-python, the TypeScript SDK and Codex's eventsource parser all do). A long prefill
#: (an agent's 17k-token prompt) or a tool call the chat splitter holds back sends no event for a
#: while; without a sign of life the proxy's `proxy.timeouts.idleSeconds` (60 s by default) or a
#: client's read timeout would take the silence for a stalled worker.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE = b": keep-alive\n\n"
#: Anthropic's sign of life, which its SDKs and Claude Code read as an event of its own.
PING = frame({"type": "ping"}, event="ping")


@contextlib.asynccontextmanager
async def keepalive(resp: EventStream | None, every: float = KEEPALIVE_SECONDS, beat: bytes = KEEPALIVE) -> AsyncIterator[None]:
    """While the block runs, `beat` (a comment line; `PING` on Anthropic's streams) goes out whenever
    `every` seconds passed with nothing written to `resp` (None: an answer that is not streamed,
    nothing to do). Leave the block before the stream's last write."""
    if resp is None:
        yield
        return

    loop = asyncio.get_running_loop()

    async def beating() -> None:
        while True:
            quiet = loop.time() - resp.last_write
            if quiet < every:
                await asyncio.sleep(every - quiet)
                continue
            try:
                await resp.write(beat)
            except (ConnectionError, RuntimeError):
                return  # the client left, or the stream ended: the handler sees it itself

    task = asyncio.create_task(beating())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
