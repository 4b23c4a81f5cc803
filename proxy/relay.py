"""Relaying a worker's answer to the client: one request's log record (`Exchange`), the worker's
first byte and stall timeouts, and streams written from the worker connection's receive callback
with backpressure (`relay`). Admission and routing happen before, in `mtpstack.proxy.app`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from aiohttp import HttpVersion11, hdrs, web
from multidict import CIMultiDict

from mtpstack.endpoints import Endpoint
from mtpstack.proxy.admission import Rejected, Upstream
from mtpstack.proxy.fleet import FLEET, NO_MODEL
from mtpstack.proxy.health import mark_unhealthy
from mtpstack.proxy.http import REQUEST_DROP, RESPONSE_DROP, filter_headers, sse_error_event
from mtpstack.proxy.state import ProxyState
from mtpstack.proxy.tenants import Tenant
from mtpstack.proxy.usage import USAGE_HEADER, Usage
from mtpstack.proxy.usage import from_body as usage_from_body
from mtpstack.proxy.usage import from_stream as usage_from_stream
from mtpstack.proxy.upstream import (UpstreamClosed, UpstreamConnectTimeout, UpstreamRefused, UpstreamReset, UpstreamResponse,
                                    UpstreamUnsent)
from mtpstack.requestid import REQUEST_ID

log = logging.getLogger("mtpstack.proxy")

#: Asks a native worker for the tokens used so far in each event of a stream (`mtpstack.usage`).
ASK_USAGE = (USAGE_HEADER, "1")
#: Client socket buffer above which the proxy stops reading from the worker.
CLIENT_HIGH_WATER = 256 * 1024
#: How often a paused stream looks whether the client has caught up; only runs while paused.
BACKPRESSURE_POLL_SECONDS = 0.005
#: Bytes of a run of chunks cut mid-event (`_StreamSink`) kept joined, to find its final event: a
#: Responses `response.completed` repeats the request's instructions and tools (tens of kB for Codex).
RUN_KEPT = 256 * 1024


@dataclass(eq=False)
class Exchange:
    """What one log line says about one request."""

    rid: str
    path: str | None  # None: the request head never arrived whole
    arrived: float
    model: str = NO_MODEL
    worker: str | None = None
    status: int = 0
    code: str | None = None  # the proxy's own error code
    #: The worker's error code, when it refused: logged, not counted as the proxy's refusal.
    worker_code: str | None = None
    stream: bool = False
    #: Its row of the endpoint table: the API (and family) whose shape a stream cut short ends in.
    endpoint: Endpoint | None = None
    queue_wait: float | None = None
    #: How the worker was chosen (`mtpstack.proxy.routing.Decision`).
    routing: str | None = None
    first_byte: float | None = None
    #: When the request went to its worker (`time.monotonic()`).
    sent: float | None = None
    #: The client's stream once its head has gone out: from then on, errors end the stream
    #: (a second answer cannot be sent).
    stream_response: web.StreamResponse | None = None
    #: Workers that never took the request (refused, reset, no connection), in order; the request
    #: went on to `worker`.
    failed_over: list[str] | None = None
    #: Called once the worker holds the request's prompt (its answer began): the routing's record of
    #: a beginning other conversations share (`mtpstack.proxy.routing.Keys.shared`).
    on_held: Callable[[], None] | None = None
    #: What a stream wrote to the client (`_StreamSink`), for `delivered` and the tokens it was sent.
    written: _StreamSink | None = None
    #: Whose key the request came with (`mtpstack.proxy.tenants.Tenant`), once it passed its limits.
    tenant: Tenant | None = None
    #: A plain answer's usage (`mtpstack.proxy.usage`): prompt, cached and completion tokens.
    usage: Usage | None = None

    def used(self) -> Usage | None:
        """The tokens the client was sent: a plain answer's usage, else its stream's last word on it."""
        if self.usage is None and self.written is not None:
            self.usage = usage_from_stream(self.written.tail())
        return self.usage

    def delivered(self) -> bool:
        """The stream's final event (`Endpoint.final_events`) went out to the client whole: the client
        has its answer, so leaving before the worker's stream ended does not make it a 499."""
        return self.written is not None and self.endpoint is not None and self.written.final_event_out(self.endpoint.final_events)

    def held(self) -> None:
        if self.on_held is not None:
            self.on_held()
            self.on_held = None

    def line(self, now: float) -> str:
        line = {
            "event": "request",
            "request_id": self.rid,
            "path": self.path,
            "model": self.model,
            "worker": self.worker,
            "status": self.status,
            "code": self.code if self.code is not None else self.worker_code,
            "stream": self.stream,
            "routing": self.routing,
            "tenant": None if self.tenant is None else self.tenant.name,
            "queue_wait_ms": None if self.queue_wait is None else round(self.queue_wait * 1000, 3),
            "first_byte_ms": None if self.first_byte is None else round(self.first_byte * 1000, 3),
            "duration_ms": round((now - self.arrived) * 1000, 3),
        }
        if self.failed_over is not None:
            line["failed_over"] = self.failed_over
        return json.dumps(line)


class Unsent(Exception):
    """The worker never took the request (`UpstreamUnsent`) and is marked unhealthy: the request may
    go to another worker of its model. `rejected` is the answer when none can take it."""

    def __init__(self, rejected: Rejected):
        super().__init__(rejected.message)
        self.rejected = rejected


class ClientGone(Exception):
    """Writing to the client failed: it disconnected (seen when the server does not cancel
    handlers on disconnect; `mtpstack proxy` does)."""

    def __init__(self, response: web.StreamResponse):
        self.response = response


async def relay(request: web.Request, state: ProxyState, upstream: Upstream, body: bytes, ex: Exchange) -> web.StreamResponse:
    t = state.config.proxy.timeouts
    name = upstream.name
    headers = filter_headers(request.headers.items(), REQUEST_DROP)
    headers.append((REQUEST_ID, ex.rid))
    headers.append(ASK_USAGE)
    if request.remote:
        headers.append((hdrs.X_FORWARDED_FOR, request.remote))
    sent = ex.sent = time.monotonic()
    try:
        async with asyncio.timeout(t.first_byte_seconds):
            up = await state.clients[name].request("POST", request.path, headers, body)
    except UpstreamUnsent as e:
        if isinstance(e, UpstreamRefused):
            rejected = _unreachable(state, upstream, f"worker `{name}` refused the connection: {upstream.url} ({e})")
        elif isinstance(e, UpstreamReset):
            rejected = _unreachable(state, upstream, f"worker `{name}` reset the connection before taking the request")
        else:
            assert isinstance(e, UpstreamConnectTimeout)
            message = f"worker `{name}` did not accept a connection within {t.connect_seconds:g} s"
            rejected = _upstream_timeout(state, upstream, message)
            mark_unhealthy(state, upstream, message)
        raise Unsent(rejected) from None
    except TimeoutError:
        raise _upstream_timeout(state, upstream, f"worker `{name}` sent no answer within {t.first_byte_seconds:g} s") from None
    except UpstreamClosed as e:
        raise _unreachable(state, upstream, f"worker `{name}` closed the connection before answering: {e}") from None
    ex.first_byte = time.monotonic() - sent
    state.metrics.observe_first_byte(name, ex.first_byte)
    try:
        out_headers = CIMultiDict(filter_headers(up.headers, RESPONSE_DROP))
        out_headers[REQUEST_ID] = ex.rid
        if up.content_type == "text/event-stream":
            return await _relay_stream(request, state, upstream, up, out_headers, ex)
        try:
            data = up.read_now()
            if data is None:
                async with asyncio.timeout(t.idle_seconds):
                    data = await up.read_all()
        except TimeoutError:
            raise _upstream_timeout(state, upstream, f"worker `{name}` stalled for {t.idle_seconds:g} s mid-answer") from None
        except UpstreamClosed:
            raise _unreachable(state, upstream, f"worker `{name}` closed the connection mid-answer") from None
        if up.status >= 400:
            ex.worker_code = _error_code(data)
        else:
            ex.held()
            ex.usage = usage_from_body(data)
        return web.Response(status=up.status, body=data, headers=out_headers)
    finally:
        up.close()  # a no-op for a finished answer, whose connection went back to the pool


def _error_code(data: bytes) -> str | None:
    """The `error.code` of a worker's refusal, for the request's log line; Anthropic's shape has no
    code, so its `error.type` (`invalid_request_error`, ...)."""
    try:
        error = json.loads(data)["error"]
        code = error.get("code") or error.get("type")
    except (ValueError, LookupError, TypeError, AttributeError):
        return None
    return code[:64] if isinstance(code, str) else None


def _unreachable(state: ProxyState, upstream: Upstream, message: str) -> Rejected:
    state.metrics.upstream_error(upstream.name, "upstream_unreachable")
    mark_unhealthy(state, upstream, message)
    return Rejected(HTTPStatus.BAD_GATEWAY, "upstream_unreachable", message)


def _upstream_timeout(state: ProxyState, upstream: Upstream, message: str) -> Rejected:
    state.metrics.upstream_error(upstream.name, "upstream_timeout")
    return Rejected(HTTPStatus.GATEWAY_TIMEOUT, "upstream_timeout", message)


class _IdleWatchdog:
    """Cancels the relaying task when the stream has been silent for `idle` seconds.
    One timer per stream, re-armed lazily: a chunk costs one clock read, not a timer."""

    def __init__(self, idle: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.idle = idle
        self.fired = False
        self.last = self.loop.time()
        self.handle = self.loop.call_at(self.last + idle, self._check)

    def _check(self) -> None:
        deadline = self.last + self.idle
        if self.loop.time() >= deadline:
            self.fired = True
            assert self.task is not None
            self.task.cancel()
        else:
            self.handle = self.loop.call_at(deadline, self._check)

    def stop(self) -> None:
        self.handle.cancel()


class _StreamSink:
    """Writes a worker's stream to the client from the worker connection's receive callback
    (`UpstreamResponse.pump`), framing chunks itself, and pauses reading from the worker while
    the client's socket buffer is over `CLIENT_HIGH_WATER` (backpressure).

    It also keeps what it takes to tell whether the stream's final event went out
    (`final_event_out`), for an `endswith` and a few stores per chunk: nothing is searched until
    then. A run is the chunks from one that begins an event (the stream's first, or one after a
    chunk ending with a blank line) to one that ends with a blank line, so it holds whole events.
    Nearly every chunk is a run of its own (a worker writes whole events); the chunks of a longer
    run are kept joined up to `RUN_KEPT` bytes, then only its last chunk. An event that begins in a
    chunk not kept is not seen: a final event can be missed (the request then counts as one whose
    client left, as it did before), only after that many bytes without a chunk ending an event."""

    def __init__(self, up: UpstreamResponse, transport: asyncio.Transport | None, chunked: bool, dog: _IdleWatchdog,
                 resp: web.StreamResponse):
        self.up = up
        self.transport = transport
        self.chunked = chunked
        self.dog = dog
        self.resp = resp
        self.last = b""
        self.prev = b""  # the chunk before `last`: a final event's usage comment came with the one before
        self.paused = False
        self.at_boundary = True  # the stream's first byte begins an event
        self.run: bytes | bytearray = b""  # the run being written: its first chunk, or its chunks joined
        self.run_first: bytes | bytearray = b""  # the last whole run: its first chunk (or its chunks joined) ...
        self.run_last: bytes | bytearray = b""  # ... and its last chunk

    def __call__(self, data: bytes) -> None:
        t = self.transport
        if t.is_closing():
            raise ClientGone(self.resp)
        t.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        self.dog.last = self.dog.loop.time()
        if self.at_boundary and data.endswith(b"\n\n") and len(data) > 2:  # whole events, as nearly every chunk is
            self.prev = self.last
            self.last = self.run_first = self.run_last = data
        else:
            self.wrote(data)
        if not self.paused and t.get_write_buffer_size() > CLIENT_HIGH_WATER:
            self.paused = True
            self.up.pause_reading()
            self.dog.loop.call_later(BACKPRESSURE_POLL_SECONDS, self._check)

    def wrote(self, data: bytes) -> None:
        """`data` went out to the client (through this sink, or written by the relay itself)."""
        self.prev = self.last
        self.last = data
        if self.at_boundary:
            self.run = data
        elif len(self.run) < RUN_KEPT:
            if type(self.run) is bytes:
                self.run = bytearray(self.run)  # appended to in place: a long run is not copied over and over
            self.run += data
            data = self.run  # the run whole so far
        if data.endswith(b"\n\n"):
            self.at_boundary = True
            if len(data) > 2:  # a blank line after the final event keeps it the last whole run
                self.run_first, self.run_last = self.run, data
        else:
            self.at_boundary = False

    def tail(self) -> bytes:
        """The last bytes written that are kept, oldest first: the last whole run, then the last two chunks."""
        recent = (self.prev, self.last)
        parts: list[bytes | bytearray] = []
        for chunk in (self.run_first, self.run_last):
            if all(chunk is not p for p in (*parts, *recent)):
                parts.append(chunk)
        return b"".join([*parts, *recent])

    def final_event_out(self, finals: tuple[bytes, ...]) -> bool:
        """Whether the last whole run holds an event starting with one of `finals`."""
        run = self.run_first if self.run_last is self.run_first else self.run_first + self.run_last
        return any(event.lstrip(b"\r\n").startswith(finals) for event in run.split(b"\n\n"))

    def _check(self) -> None:
        if self.up.done or self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size() > CLIENT_HIGH_WATER // 2:
            # Still full: the client is slow. Its silence must not count as the worker's.
            self.dog.last = self.dog.loop.time()
            self.dog.loop.call_later(BACKPRESSURE_POLL_SECONDS, self._check)
        else:
            self.paused = False
            self.up.resume_reading()


async def _relay_stream(
    request: web.Request, state: ProxyState, upstream: Upstream, up: UpstreamResponse, out_headers, ex: Exchange
) -> web.StreamResponse:
    """Chunks go out as the worker writes them. The first goes through aiohttp (with the
    head); the rest are written from the worker connection's receive callback, so a chunk
    costs no task wake-up. The proxy stops reading from the worker while the client's socket
    buffer is full (backpressure)."""
    resp = web.StreamResponse(status=up.status, headers=out_headers)
    chunked = request.version >= HttpVersion11
    if chunked:
        resp.enable_chunked_encoding()
    try:
        await resp.prepare(request)
    except ConnectionError:
        # The client left in the same loop turn as the worker's head arrived: the handler's
        # cancellation is still pending, and writing the head is what finds the socket closed.
        raise ClientGone(resp) from None
    ex.stream_response = resp
    dog = _IdleWatchdog(state.config.proxy.timeouts.idle_seconds)
    sink = ex.written = _StreamSink(up, request.transport, chunked, dog, resp)
    failure: tuple[str, str] | None = None
    try:
        try:
            first = await up.read_chunk()
            if first:
                dog.last = dog.loop.time()
                if up.status < 400:
                    ex.held()
                if ex.sent is not None:
                    # Measured at the first content chunk, not the head: a worker sends its
                    # head before prefill, so the head's time says nothing about the first token.
                    ttft = time.monotonic() - ex.sent
                    state.metrics.observe_first_token(upstream.name, ttft)
                    request.app[FLEET].first_token(upstream.name, ttft)
                try:
                    await resp.write(first)
                except ConnectionError:
                    raise ClientGone(resp) from None
                sink.wrote(first)
                if not up.done and sink.transport is not None:
                    await up.pump(sink)
        except UpstreamClosed:
            failure = ("upstream_disconnected", f"worker `{upstream.name}` closed the connection mid-stream")
            state.metrics.upstream_error(upstream.name, "upstream_disconnected")
            mark_unhealthy(state, upstream, "connection lost mid-stream")
    except asyncio.CancelledError:
        if not dog.fired:
            raise
        current = asyncio.current_task()
        assert current is not None
        current.uncancel()
        idle = state.config.proxy.timeouts.idle_seconds
        failure = ("upstream_timeout", f"worker `{upstream.name}` sent nothing for {idle:g} s mid-stream")
        state.metrics.upstream_error(upstream.name, "upstream_timeout")
    finally:
        dog.stop()
    if failure is not None:
        ex.code = failure[0]
        log.warning("request %s: %s; its stream ends with an `%s` error event", ex.rid, failure[1], failure[0])
        last = sink.last or b"\n\n"
        # Close any event the worker left half-written, so the error is an event of its own.
        event = (b"" if last.endswith(b"\n\n") else b"\n\n") + sse_error_event(*failure, ex.endpoint, last)
        try:
            await resp.write(event)
        except ConnectionError:
            raise ClientGone(resp) from None
        sink.wrote(event)
    try:
        await resp.write_eof()
    except ConnectionError:
        raise ClientGone(resp) from None
    return resp
