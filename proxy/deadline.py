"""The client deadline: a client must send a whole request within `proxy.timeouts.clientSeconds`.

aiohttp has no deadline for a request head: a client dripping one byte at a time, or
opening a connection and saying nothing, holds it forever. `ClientDeadlines` wraps
aiohttp's protocol per connection and arms a timer when the connection opens and again
when an answer ends; a head that has not arrived when it fires has its connection closed
(and, when some of it had come, logged as 408 through `on_late_head`). The handler reads
the body against the same deadline (`deadline_of`): it is counted from the head's start,
so a body dripped byte by byte cannot stretch it. A deadline, never an idle timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

REQUEST_DEADLINE = "mtpstack.client_deadline"


class _Connection(asyncio.Protocol):
    """One client connection: aiohttp's own protocol inside, the deadline around it."""

    def __init__(self, owner: "ClientDeadlines", inner: asyncio.Protocol):
        self.owner = owner
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.started = self.loop.time()
        self.handle: asyncio.TimerHandle | None = None
        self.busy = 0  # requests being handled: no head deadline meanwhile
        self.partial = False  # bytes of a head arrived since the deadline was armed

    def _arm(self) -> None:
        """The deadline counts from now. One timer per connection at a time, moved lazily: an answer
        ending on a kept-alive connection costs a clock read, not a timer (`_expire` re-arms)."""
        self.started = self.loop.time()
        self.partial = False
        if self.handle is None:
            self.handle = self.loop.call_at(self.started + self.owner.seconds, self._expire)

    def _expire(self) -> None:
        self.handle = None
        if self.busy or self.transport is None or self.transport.is_closing():
            return  # `answered` arms it again
        deadline = self.started + self.owner.seconds
        if self.loop.time() < deadline:  # re-armed since this timer was set
            self.handle = self.loop.call_at(deadline, self._expire)
            return
        if self.partial:
            self.owner.on_late_head(self.transport.get_extra_info("peername"))
        # abort, not close: a client that reads nothing must not hold the socket either.
        self.transport.abort()

    def head_arrived(self) -> float:
        """A request reached the app: the deadline it started under, for reading its body."""
        self.busy += 1  # a timer left running finds the connection busy and stops
        return self.started + self.owner.seconds

    def answered(self) -> None:
        self.busy -= 1
        if not self.busy and self.handle is None and self.transport is not None and not self.transport.is_closing():
            self._arm()

    # -- asyncio.Protocol, forwarded ------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.owner.connections[transport] = self
        self._arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.partial = True
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.owner.connections.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ClientDeadlines:
    """Deadlines of every connection of one listening socket."""

    def __init__(self, seconds: float, on_late_head: Callable[[Any], None]):
        self.seconds = seconds
        self.on_late_head = on_late_head
        self.connections: dict[Any, _Connection] = {}

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Connection(self, inner())


def deadline_of(request: web.Request, seconds: float) -> float:
    """When the request's body must have arrived, in loop time. Without a deadline wrapper
    (aiohttp's test server), counted from now: the head has arrived."""
    deadline = request.get(REQUEST_DEADLINE)
    return deadline if deadline is not None else asyncio.get_running_loop().time() + seconds


def middleware(deadlines_of: Callable[[web.Application], ClientDeadlines | None]):
    """Marks each request's connection busy while it is handled, and records its deadline."""

    @web.middleware
    async def client_deadline(request: web.Request, handler):
        deadlines = deadlines_of(request.app)
        conn = deadlines.connections.get(request.transport) if deadlines is not None else None
        if conn is None:
            return await handler(request)
        request[REQUEST_DEADLINE] = conn.head_arrived()
        try:
            return await handler(request)
        finally:
            conn.answered()

    return client_deadline
