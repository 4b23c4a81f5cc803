"""The proxy's HTTP/1.1 client for its workers: keep-alive connections on an asyncio Protocol.

Why not aiohttp's `ClientSession`: on the machine this was built on it cost about 350-480 us
of CPU and 1.8-2.9 ms of wall time per small request to a loopback worker, against about
70 us and 0.2-0.3 ms for a bare asyncio exchange (same worker, same process). The proxy talks
to a handful of known workers over plain HTTP/1.1 with request bodies already in memory, which
is all this client supports: no TLS, no redirects, no cookies, no proxies.

Answers may be framed by Content-Length, chunked transfer coding, or the connection closing
(mlx_lm.server's HTTP/1.0 streams). `UpstreamResponse.read_chunk()` returns whatever payload
has arrived (every complete chunk in the buffer at once), so streams pass through as the worker
writes them, without one wake-up per chunk when chunks arrive together.
"""

from __future__ import annotations

import asyncio
from typing import Callable, cast

#: Idle keep-alive connections kept per worker: more than the widest gate (4), so a full gate
#: reuses its connections, and few enough that an idle fleet holds no pile of sockets.
MAX_IDLE_PER_WORKER = 8
#: Largest header block accepted from a worker; a worker's headers are a few hundred bytes.
HEAD_LIMIT = 64 * 1024
#: Stop reading from a worker while this much is buffered and unread (backpressure: the
#: worker's socket fills and its writes wait, as with a slow client).
READ_HIGH_WATER = 256 * 1024


class UpstreamError(Exception):
    """A worker could not be reached or broke off its answer."""


class UpstreamUnsent(UpstreamError):
    """The worker never took the request: it may go to another worker. What counts (as nginx
    retries a POST only when it was not sent, and Envoy on `connect-failure` or
    `reset-before-request`): no connection at all (`UpstreamRefused`, `UpstreamConnectTimeout`),
    or a connection the worker's kernel reset before one byte of an answer (`UpstreamReset`)."""


class UpstreamRefused(UpstreamUnsent):
    """No connection: refused, or the address is unreachable."""


class UpstreamConnectTimeout(UpstreamUnsent):
    """The worker did not accept a connection in time."""


class UpstreamReset(UpstreamUnsent):
    """The connection was reset (RST, not a close) before one byte of an answer. A kernel resets a
    connection whose process never read what arrived: a worker killed before it accepted the
    connection or before it read the whole request. Workers act on a request only once its body is
    read whole (aiohttp and mlx_lm.server close, never reset, a connection they read), so none acted
    on this one. A clean close with nothing back is not this: the worker may have read it all."""


class UpstreamClosed(UpstreamError):
    """The worker closed the connection before its answer was complete (or sent garbage)."""


class _Conn(asyncio.Protocol):
    """One connection: a receive buffer, a waiter, and the end-of-stream flag."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        #: The connection ended by a reset (RST) rather than a close (FIN).
        self.reset = False
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None
        #: While an answer is pumped (`UpstreamResponse.pump`): called on every arrival instead
        #: of waking a task.
        self.sink: Callable[[], None] | None = None

    # Protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do all a `Transport` does without
        # deriving from the class.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.sink is not None:
            self.sink()
            return
        if len(self.buf) > READ_HIGH_WATER and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        if self.sink is not None:
            self.sink()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, (ConnectionResetError, BrokenPipeError)) and not self.eof:
            self.reset = True
        self.eof = True
        self._wake()
        if self.sink is not None:
            self.sink()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # Used by the client
    async def wait_data(self) -> None:
        """Wait for more bytes (or the end)."""
        if self.eof:
            return
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self, n: int | None = None) -> bytes:
        if n is None or n >= len(self.buf):
            data = bytes(self.buf)
            self.buf.clear()
        else:
            data = bytes(self.buf[:n])
            del self.buf[:n]
        if self.paused and len(self.buf) < READ_HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    @property
    def usable(self) -> bool:
        return not self.eof and not self.buf and self.transport is not None and not self.transport.is_closing()


# chunked-decoding states
_SIZE, _DATA, _DATA_END, _TRAILERS = range(4)


class UpstreamResponse:
    """The head of a worker's answer, and its body as it arrives."""

    def __init__(self, client: UpstreamClient, conn: _Conn, status: int, headers: list[tuple[str, str]],
                 content_type: str, framing: str, remaining: int, keep_alive: bool):
        self.status = status
        self.headers = headers
        self.content_type = content_type
        self.done = False
        self._client = client
        self._conn: _Conn | None = conn
        #: "length", "chunked", "close" (until the connection ends) or "none"
        self._framing = framing
        self._remaining = remaining
        self._keep_alive = keep_alive
        self._state = _SIZE
        self._chunk_left = 0

    def _available(self) -> bytes:
        """The body bytes decodable now, without waiting; marks the answer done at its end.
        Raises `UpstreamClosed` when the connection ended before the body did."""
        if self.done:
            return b""
        conn = self._conn
        assert conn is not None
        if self._framing == "chunked":
            data = self._decode_chunked(conn)
        elif self._framing == "length":
            data = conn.take(self._remaining) if conn.buf else b""
            self._remaining -= len(data)
            if self._remaining <= 0:
                self._finish()
        elif self._framing == "close":
            data = conn.take() if conn.buf else b""
            if not data and conn.eof:
                self._finish()
        else:
            self._finish()
            return b""
        if not data and not self.done and conn.eof:
            self.close()
            raise UpstreamClosed("the connection closed before the answer was complete")
        return data

    async def read_chunk(self) -> bytes:
        """The body bytes that have arrived (waiting for some if none have); b"" at the end.
        Raises `UpstreamClosed` when the connection ends before the body does."""
        while True:
            data = self._available()
            if data or self.done:
                return data
            assert self._conn is not None
            await self._conn.wait_data()

    def pump(self, write: Callable[[bytes], None]) -> asyncio.Future[None]:
        """From now on hand the body to `write` as it arrives, straight from the connection's
        receive callback: no task wake-up per chunk. The future ends with the body, or with
        `UpstreamClosed`, or with whatever `write` raised (the connection is then dropped).
        Pair with `pause_reading()`/`resume_reading()` for backpressure."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn = self._conn

        def on_data() -> None:
            try:
                data = self._available()
                if data:
                    write(data)
            except BaseException as e:
                self.close()
                if not fut.done():
                    fut.set_exception(e)
                return
            if self.done and not fut.done():
                fut.set_result(None)

        if conn is None:
            fut.set_result(None)
            return fut
        conn.sink = on_data
        on_data()
        return fut

    def pause_reading(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.resume_reading()

    def _decode_chunked(self, conn: _Conn) -> bytes:
        """Every payload byte decodable from the buffer now (possibly several chunks)."""
        buf = conn.buf
        out = bytearray()
        pos = 0
        while True:
            if self._state == _SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if len(buf) - pos > 1024:
                        raise self._malformed(conn, "chunk size line too long")
                    break
                try:
                    size = int(bytes(buf[pos:end]).split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise self._malformed(conn, "malformed chunk size") from None
                pos = end + 2
                if size == 0:
                    self._state = _TRAILERS
                else:
                    self._chunk_left = size
                    self._state = _DATA
            elif self._state == _DATA:
                n = min(self._chunk_left, len(buf) - pos)
                if n == 0:
                    break
                out += buf[pos:pos + n]
                pos += n
                self._chunk_left -= n
                if self._chunk_left == 0:
                    self._state = _DATA_END
            elif self._state == _DATA_END:
                if len(buf) - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise self._malformed(conn, "malformed chunk terminator")
                pos += 2
                self._state = _SIZE
            else:  # _TRAILERS: lines until an empty one
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                empty = end == pos
                pos = end + 2
                if empty:
                    del buf[:pos]
                    pos = 0
                    self._finish()
                    break
        if pos:
            conn.take(pos)
        return bytes(out)

    def _malformed(self, conn: _Conn, why: str) -> UpstreamClosed:
        self.close()
        return UpstreamClosed(why)

    def read_now(self) -> bytes | None:
        """The whole body when all of it has arrived (a short answer comes with its head), else None."""
        conn = self._conn
        if self.done:
            return b""
        if self._framing == "length" and conn is not None and len(conn.buf) >= self._remaining:
            return self._available()
        return None

    async def read_all(self) -> bytes:
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def _finish(self) -> None:
        self.done = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.sink = None
            if conn.paused or (conn.transport is not None and not conn.transport.is_reading()):
                conn.paused = False
                if conn.transport is not None and not conn.transport.is_closing():
                    conn.transport.resume_reading()
            if self._keep_alive and conn.usable:
                self._client._put_idle(conn)
            else:
                conn.abort()

    def close(self) -> None:
        """Drop the connection of an unfinished answer (the worker sees the client go);
        a no-op once the answer is complete."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.sink = None
            conn.abort()


class UpstreamClient:
    """Keep-alive HTTP/1.1 to one worker. One event loop; not thread-safe."""

    def __init__(self, host: str, port: int, connect_timeout: float):
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self._host_header = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode()
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                transport, conn = await loop.create_connection(_Conn, self.host, self.port)
        except TimeoutError:
            raise UpstreamConnectTimeout(f"no connection within {self.connect_timeout:g} s") from None
        except OSError as e:
            raise UpstreamRefused(e.strerror or str(e)) from None
        # The request is written at once, with the transport `create_connection` returned: not
        # left to `connection_made`, which the protocol contract does not order before the return
        # (asyncio and uvloop 0.23 call it first; it is the same object either way).
        conn.transport = transport
        return conn

    def _put_idle(self, conn: _Conn) -> None:
        if len(self._idle) < MAX_IDLE_PER_WORKER:
            self._idle.append(conn)
        else:
            conn.abort()

    def _pop_idle(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
            conn.abort()
        return None

    def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()

    def _head(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
        lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self._host_header]
        for name, value in headers:
            lines.append(name.encode("latin-1") + b": " + value.encode("utf-8", "surrogateescape"))
        if body or method == "POST":
            lines.append(b"Content-Length: %d" % len(body))
        lines.append(b"\r\n")
        return b"\r\n".join(lines)

    async def request(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"") -> UpstreamResponse:
        """Send a request and read the answer's head. A reused keep-alive connection that the
        worker had closed (no byte of an answer came back) is retried once on a fresh one.
        `UpstreamUnsent` when the worker never took the request (see there)."""
        data = self._head(method, path, headers, body) + body
        for attempt in range(2):
            conn = self._pop_idle() if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            try:
                assert conn.transport is not None
                conn.transport.write(data)
                return await self._read_head(conn, method)
            except UpstreamClosed as e:
                conn.abort()
                if e.args and e.args[0] == _NOTHING_BACK:
                    if reused:
                        continue
                    if conn.reset:
                        raise UpstreamReset("the worker reset the connection before reading the request") from None
                raise
            except BaseException:
                conn.abort()
                raise
        raise AssertionError("unreachable")

    async def _read_head(self, conn: _Conn, method: str) -> UpstreamResponse:
        while True:
            end = conn.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.buf) > HEAD_LIMIT:
                    raise UpstreamClosed("the answer's header block is too large")
                if conn.eof:
                    raise UpstreamClosed(_NOTHING_BACK if not conn.buf else "the connection closed mid-header")
                await conn.wait_data()
                continue
            head = conn.take(end + 4)
            lines = head[:-4].split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise UpstreamClosed("the answer is not HTTP/1.x")
            status = int(parts[1])
            if 100 <= status < 200 and status != 101:
                continue  # interim answers (100 Continue) carry nothing for the client
            break
        http10 = parts[0] == b"HTTP/1.0"
        headers: list[tuple[str, str]] = []
        length = None
        chunked = False
        conn_tokens: set[str] = set()
        content_type = ""
        for raw in lines[1:]:
            name, sep, value = raw.partition(b":")
            if not sep:
                continue
            n = name.strip().decode("latin-1")
            v = value.strip().decode("utf-8", "surrogateescape")
            low = n.lower()
            if low == "content-length":
                try:
                    length = int(v)
                except ValueError:
                    raise UpstreamClosed("malformed Content-Length") from None
            elif low == "transfer-encoding":
                chunked = "chunked" in v.lower()
            elif low == "connection":
                conn_tokens |= {t.strip().lower() for t in v.split(",")}
            elif low == "content-type":
                content_type = v.split(";", 1)[0].strip().lower()
            headers.append((n, v))
        keep_alive = ("keep-alive" in conn_tokens) if http10 else ("close" not in conn_tokens)
        if method == "HEAD" or status in (204, 304):
            framing, remaining = "none", 0
        elif chunked:
            framing, remaining = "chunked", 0
        elif length is not None:
            framing, remaining = "length", length
        else:
            framing, remaining, keep_alive = "close", 0, False
        resp = UpstreamResponse(self, conn, status, headers, content_type, framing, remaining, keep_alive)
        if framing == "none" or (framing == "length" and remaining == 0):
            resp._finish()
        return resp


#: The message of an `UpstreamClosed` raised when not one byte of an answer came back.
_NOTHING_BACK = "the connection closed before an answer"
