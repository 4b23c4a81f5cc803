"""HTTP clients on raw sockets, for what a library client will not do: send malformed bytes, drip a
request forever, or leave mid-stream by exactly a FIN or an RST. Used by the hostile-input tests,
`bench/scripts/load_bench.py` (its `hostile` mode too).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
import urllib.error
import urllib.request
from dataclasses import dataclass


def request_bytes(path: str, body: bytes, extra: list[tuple[str, str]] = (), method: str = "POST", host: str = "x") -> bytes:
    """One HTTP/1.1 request with a JSON body, byte for byte; `extra` headers after Content-Length."""
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body

def json_answer(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None,
                timeout: float = 30.0) -> tuple[int, dict, object]:
    """(status, headers, JSON body) of one request, error statuses included; raises on a body
    that is not JSON (aiohttp's plain-text refusals)."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def status_of(head: bytes) -> int | None:
    """The status code of a response that starts with `head`; None when it is no HTTP/1 status line."""
    if not head.startswith(b"HTTP/1."):
        return None
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


@dataclass
class RawResult:
    status: int | None  # None: the connection closed (or timed out) without a status line
    closed: bool  # the server closed the connection
    seconds: float
    timed_out: bool = False


def raw_exchange(host: str, port: int, data: bytes, timeout: float = 10.0) -> RawResult:
    """Send `data` on a fresh connection and read the answer's status line. The sending side
    stays open (aiohttp takes a half-close for a client gone), so a request that promises more
    body than it sends is a slow client: `slow_client` sends those on purpose. A server that
    neither answers nor closes within `timeout` is `timed_out`."""
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # the server may answer and close before reading all of a huge request
        buf = b""
        try:
            while b"\r\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except (TimeoutError, socket.timeout):
            return RawResult(None, False, time.monotonic() - start, timed_out=True)
        except OSError:
            return RawResult(None, True, time.monotonic() - start)
    status = status_of(buf)
    return RawResult(status, not buf or status is not None, time.monotonic() - start)


SLOW_KINDS = ("drip-head", "drip-body", "short-body", "endless-chunks", "silent")


def slow_client(host: str, port: int, kind: str, interval: float, bound: float) -> RawResult:
    """A client that never finishes its request: bytes dripped every `interval` s until the
    server answers or closes, or `bound` s pass (a hang). Returns how it ended."""
    body = b'{"model": "m", "prompt": "x"}'
    if kind == "drip-head":
        first, drip = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"X"
    elif kind == "drip-body":
        first, drip = request_bytes("/v1/completions", body)[: -len(body)].replace(
            b"Content-Length: %d" % len(body), b"Content-Length: 100000"), b" "
    elif kind == "short-body":
        first, drip = request_bytes("/v1/completions", body)[:-5], b""
    elif kind == "endless-chunks":
        first = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        drip = b"1\r\n \r\n"
    else:
        first, drip = b"", b""
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=bound) as s:
        s.setblocking(False)
        s.sendall(first)
        buf = b""
        while time.monotonic() - start < bound:
            try:
                chunk = s.recv(65536)
                if not chunk:
                    break  # closed
                buf += chunk
                if b"\r\n" in buf:
                    break
            except BlockingIOError:
                pass
            except OSError:
                break
            if drip:
                try:
                    s.send(drip)
                except BlockingIOError:
                    pass
                except OSError:
                    break
            time.sleep(interval)
        else:
            return RawResult(None, False, time.monotonic() - start, timed_out=True)
    return RawResult(status_of(buf), True, time.monotonic() - start)


@dataclass
class RawStream:
    """One streamed request over an asyncio socket, so closing it is exactly a FIN or an RST."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int | None = None
    buffer: bytes = b""
    events: int = 0

    @classmethod
    async def open(cls, host: str, port: int, body: dict, request_id: str | None = None, path: str | None = None) -> RawStream:
        """`path`: by default chat completions for a body with `messages`, else completions."""
        reader, writer = await asyncio.open_connection(host, port)
        path = path or ("/v1/chat/completions" if "messages" in body else "/v1/completions")
        extra = [("X-Request-Id", request_id)] if request_id else []
        writer.write(request_bytes(path, json.dumps(body).encode(), [*extra, ("Connection", "close")], host=f"{host}:{port}"))
        await writer.drain()
        return cls(reader, writer)

    async def headers(self) -> int:
        head = await self.reader.readuntil(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])
        return self.status

    async def until_events(self, n: int) -> bool:
        """Read until `n` SSE events arrived; False at end of stream first."""
        while self.events < n:
            chunk = await self.reader.read(65536)
            if not chunk:
                return False
            self.buffer = (self.buffer + chunk)[-4096:]
            self.events += chunk.count(b"data: ")
        return True

    async def outcome(self) -> str:
        """Read to the end: `done` ([DONE] seen), `error_event`, `cut` (ended with neither), or `status_N`."""
        if self.status is None:
            await self.headers()
        rest = await self.reader.read()
        tail = self.buffer + rest
        if self.status != 200:
            return f"status_{self.status}"
        if b"data: [DONE]" in tail:
            return "done"
        if b'data: {"error"' in tail:
            return "error_event"
        return "cut"

    def close(self, how: str = "fin") -> None:
        """Close by FIN (`fin`) or by RST (`rst`: SO_LINGER with a zero timeout)."""
        if how == "rst":
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.close()


async def leave_streams(host: str, port: int, requests: list[tuple[str, dict]], after_events: int = 2) -> list[int | None]:
    """Open each streamed request (path, body) in turn, read `after_events` events, then leave: by FIN
    and RST by turns, at different points of the server's writing. Their statuses."""
    statuses = []
    for i, (path, body) in enumerate(requests):
        stream = await RawStream.open(host, port, body, request_id=f"left-{i}", path=path)
        statuses.append(await stream.headers())
        await stream.until_events(after_events)
        stream.close("rst" if i % 2 else "fin")
        await asyncio.sleep(0.02 * (i % 4))
    return statuses
