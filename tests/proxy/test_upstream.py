"""The proxy's upstream HTTP client against raw loopback servers: the three ways an answer can
be framed, chunks split across packets, stale keep-alive connections, refused connections."""

from __future__ import annotations

import asyncio

import pytest

from mtpstack.proxy.upstream import UpstreamClient, UpstreamClosed, UpstreamRefused


async def raw_server(script):
    """A TCP server that reads one request head per answer and runs `script(reader, writer)`."""
    conns = []

    async def handle(reader, writer):
        conns.append(writer)
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], conns


async def read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


async def test_http10_stream_framed_by_close_is_read_to_the_end():
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        for i in range(3):
            writer.write(b"data: %d\n\n" % i)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.close()

    server, port, _ = await raw_server(script)
    async with server:
        resp = await UpstreamClient("127.0.0.1", port, 1.0).request("POST", "/v1/completions", [], b"{}")
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert await resp.read_all() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_chunks_split_across_packets_are_reassembled():
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
        for piece in (b"0", b"b\r\ndata: abc", b"\n\n\r", b"\n5;ext=1\r\nhello\r\n", b"0\r\n", b"X-Trailer: 1\r\n\r\n"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.005)

    server, port, _ = await raw_server(script)
    async with server:
        client = UpstreamClient("127.0.0.1", port, 1.0)
        resp = await client.request("POST", "/x", [("X-A", "1")], b"{}")
        assert await resp.read_all() == b"data: abc\n\nhello"
        assert resp.done


async def test_truncated_chunked_answer_raises_upstream_closed():
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nonly-part")
        await writer.drain()
        writer.transport.abort()

    server, port, _ = await raw_server(script)
    async with server:
        resp = await UpstreamClient("127.0.0.1", port, 1.0).request("POST", "/x", [], b"{}")
        with pytest.raises(UpstreamClosed):
            await resp.read_all()


async def test_a_keep_alive_connection_the_worker_closed_is_retried_on_a_fresh_one():
    served = 0

    async def script(reader, writer):
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # The connection stays open, as keep-alive promises, until the client's next request
        # arrives: then it is closed without an answer (an idle timeout racing a new request).
        await reader.read(1)
        writer.transport.abort()

    server, port, _ = await raw_server(script)
    async with server:
        client = UpstreamClient("127.0.0.1", port, 1.0)
        first = await client.request("POST", "/x", [], b"{}")
        assert await first.read_all() == b"ok"
        second = await client.request("POST", "/x", [], b"{}")
        assert await second.read_all() == b"ok"
        assert served == 2


async def test_refused_connection_is_upstream_refused():
    server, port, _ = await raw_server(lambda r, w: asyncio.sleep(0))
    server.close()
    await server.wait_closed()
    with pytest.raises(UpstreamRefused):
        await UpstreamClient("127.0.0.1", port, 1.0).request("GET", "/health", [])


async def test_an_http10_worker_streams_through_the_proxy(aiohttp_client):
    """mlx_lm.server answers streams over HTTP/1.0, ended by closing the connection."""
    from mtpstack.proxy import create_app
    from mtpstack.validator import FleetConfig

    async def script(reader, writer):
        req = await read_request(reader)
        if req.startswith(b"GET /health"):
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
        else:
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            for i in range(3):
                writer.write(b"data: %d\n\n" % i)
                await writer.drain()
            writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()

    server, port, _ = await raw_server(script)
    async with server:
        config = FleetConfig.model_validate(
            {"policy": {"allowedBackends": ["mlx-lm"]},
             "workers": {"w": {"model": "m", "backend": "mlx-lm", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": port}}}
        )
        client = await aiohttp_client(create_app(config, health_interval=60))
        r = await client.post("/v1/chat/completions", json={"model": "m", "stream": True})
        assert r.status == 200
        assert await r.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
