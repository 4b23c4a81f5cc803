"""A scripted OpenAI-compatible upstream for the proxy's tests and benchmark.

It speaks the worker's HTTP interface (`/health`, the two completion endpoints, SSE with
`data: [DONE]`, 429 `worker_full` when full) without a model, and it counts its own
concurrency: a request above its gate is refused with 429 and recorded as a violation, so a
proxy that over-admits fails loudly. Like the native worker, it grants a short grace before
refusing, so a slot that frees a moment later (a disconnect noticed late) is not a violation.

Each request may steer the answer with an extension field `x_fake` in its JSON body:
`{"delay": s, "chunks": n, "interval": s, "die_after": n, "status": code, "pad": bytes, "first_after": s}`: time
before the answer, number of SSE chunks (when `stream` is true), pause between chunks, drop the
connection after n chunks (a worker dying mid-stream), a status to answer with, and padding per
chunk (an SSE comment) to stream megabytes; `first_after`: seconds between a stream's head and its
first chunk (a prefill). A stream ends with its API's final event (`data: [DONE]`, Responses'
`response.completed`, Messages' `message_stop`); `linger`: seconds between that event and the stream's
end (a worker with bytes still to send once its client has all it reads); `split`: the final event
written in that many pieces, a short pause apart (so the proxy reads it in several chunks);
`final_pad`: bytes of padding inside the final event's data (a large `response.completed`);
`hold`: a name; the request keeps its slot until the test calls `FakeState.release(name)` (a slot
held for as long as a test needs, where a `delay` can run out first on a loaded machine);
`hold_first`: the same for a stream's first chunk, once its head is out (a prefill that lasts until
the test says); `prompt_tokens`, `cached_tokens`: the usage it reports (default 10 and 0; one completion
token per chunk, one for a plain answer), as the native worker does: a plain answer's `usage` in its
API's shape, and with `X-Mtpstack-Usage: 1` (the proxy's) a `: usage` comment in each event (`mtpstack.usage`).

Run alone: `python -m devkit.fake_upstream --port 8101 --gate 2 [--chunks 256 --interval 0.004]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from http import HTTPStatus

from aiohttp import web

from mtpstack.endpoints import ENDPOINTS
from mtpstack.usage import USAGE_HEADER, with_usage
from mtpstack.validator import MAX_HEADER_BYTES

#: Like the native worker's `--admission-grace-seconds`, shortened for tests.
DEFAULT_GRACE_SECONDS = 0.1


@dataclass
class FakeState:
    gate: int
    name: str = "fake"
    chunks: int = 8
    interval: float = 0.0
    delay: float = 0.0
    grace: float = DEFAULT_GRACE_SECONDS
    health_status: int = 200
    #: Put the send time (`time.monotonic()`, one clock for every process on the machine)
    #: into each chunk as `"t"`, so a client can measure each chunk's delivery delay.
    stamp: bool = False
    active: int = 0
    max_active: int = 0
    violations: int = 0
    served: int = 0
    #: Chunks of the current (latest) stream handed to the socket so far.
    chunks_written: int = 0
    #: `x_fake.tag` (or the request id) of each request, in arrival order.
    arrivals: list = field(default_factory=list)
    models: list = field(default_factory=list)
    last_headers: dict = field(default_factory=dict)
    #: Requests whose connection closed before they finished (seen as cancellation).
    cancelled: int = 0
    freed: asyncio.Event | None = None
    #: What `/identity` answers (404 when None), as the native worker's: `pid`, `started_at`,
    #: `max_num_seqs`, `target`, `drafter`, `argv`...; a test changes it to play a restart.
    identity: dict | None = None
    #: What `/metrics` answers (404 when None): Prometheus text.
    metrics: str | None = None
    #: `/identity` and `/metrics` requests answered so far.
    identity_requests: int = 0
    metrics_requests: int = 0
    #: `x_fake.hold` names, each released by `release(name)`.
    holds: dict = field(default_factory=dict)

    def _hold(self, name: str) -> asyncio.Event:
        return self.holds.setdefault(name, asyncio.Event())

    def release(self, name: str) -> None:
        """Let the requests holding `name` (now or later) go on."""
        self._hold(name).set()

    def stats(self) -> dict:
        return {
            "name": self.name,
            "gate": self.gate,
            "active": self.active,
            "max_active": self.max_active,
            "violations": self.violations,
            "served": self.served,
            "cancelled": self.cancelled,
        }


FAKE = web.AppKey("fake", FakeState)


def _chunk(i: int, endpoint: str) -> bytes:
    if endpoint == "responses":  # a Responses stream's text deltas, numbered as the API numbers its events
        event = {"type": "response.output_text.delta", "sequence_number": i, "item_id": "msg_fake", "output_index": 0,
                 "content_index": 0, "delta": f"t{i} "}
        return b"event: response.output_text.delta\ndata: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
    if endpoint == "chat":
        event = {"id": "fake", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
    else:
        event = {"id": "fake", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def final_event(endpoint: str, sequence_number: int, pad: int = 0) -> bytes:
    """The event that ends a stream of `endpoint`'s API, as the native worker ends it."""
    if endpoint == "responses":
        response = {"id": "resp_fake", "object": "response", "status": "completed", "output": [], "metadata": {"pad": "x" * pad}}
        event = {"type": "response.completed", "sequence_number": sequence_number, "response": response}
        return b"event: response.completed\ndata: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
    if endpoint == "messages":
        return b'event: message_stop\ndata: {"type":"message_stop"' + (b',"pad":"%b"' % (b"x" * pad) if pad else b"") + b"}\n\n"
    return b"data: [DONE]\n\n"


def _usage_object(endpoint: str, prompt: int, cached: int, completion: int) -> dict:
    """A plain answer's `usage` in its API's shape, as the native worker writes it."""
    if endpoint == "messages":
        return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
                "output_tokens": completion}
    if endpoint == "responses":
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": completion,
                "total_tokens": prompt + completion}
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


_CHUNK_CACHE: dict[tuple[int, str], bytes] = {}


def chunk_bytes(i: int, endpoint: str) -> bytes:
    key = (i, endpoint)
    b = _CHUNK_CACHE.get(key)
    if b is None:
        b = _CHUNK_CACHE[key] = _chunk(i, endpoint)
    return b


def _stamped(i: int) -> bytes:
    return b'data: {"t":%.9f,"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t%d "}}]}\n\n' % (time.monotonic(), i)


async def _admit(s: FakeState) -> bool:
    """Take a batch slot, waiting up to the grace for one to free; False when still full."""
    deadline = time.monotonic() + s.grace
    while s.active >= s.gate:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        assert s.freed is not None
        s.freed.clear()
        try:
            await asyncio.wait_for(s.freed.wait(), remaining)
        except TimeoutError:
            return False
    s.active += 1
    s.max_active = max(s.max_active, s.active)
    return True


def _leave(s: FakeState) -> None:
    s.active -= 1
    assert s.freed is not None
    s.freed.set()


async def completions(request: web.Request) -> web.StreamResponse:
    s = request.app[FAKE]
    path = request.path
    endpoint = ("chat" if path.endswith("/chat/completions") else "responses" if path.endswith("/responses")
                else "messages" if path.startswith("/v1/messages") else "text")
    try:
        payload = await request.json()
    except ValueError:
        return web.json_response({"error": {"message": "bad json", "type": "invalid_request_error", "code": None}}, status=400)
    ctl = payload.get("x_fake") or {}
    s.arrivals.append(ctl.get("tag", request.headers.get("X-Request-Id")))
    s.models.append(payload.get("model"))
    s.last_headers = dict(request.headers)
    if not await _admit(s):
        s.violations += 1
        print(f"fake upstream {s.name}: REFUSED a request above its gate of {s.gate} ({s.active} active)", file=sys.stderr, flush=True)
        return web.json_response(
            {"error": {"message": f"worker full: {s.active} of {s.gate}", "type": "server_error", "code": "worker_full"}},
            status=HTTPStatus.TOO_MANY_REQUESTS,
            headers={"Retry-After": "1"},
        )
    left = False
    prompt, cached = int(ctl.get("prompt_tokens", 10)), int(ctl.get("cached_tokens", 0))
    counted = request.headers.get(USAGE_HEADER) == "1"
    try:
        if "hold" in ctl:
            await s._hold(str(ctl["hold"])).wait()
        delay = float(ctl.get("delay", s.delay))
        if delay:
            await asyncio.sleep(delay)
        status = int(ctl.get("status", 200))
        if not payload.get("stream"):
            s.served += 1
            _leave(s)
            left = True
            if status >= 400:  # a refusal in the worker's error shape (Anthropic's on its paths), `code` chosen by the request
                if request.path.startswith("/v1/messages"):
                    return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message": "refused"}},
                                             status=status)
                error = {"message": "refused", "type": "invalid_request_error", "code": ctl.get("code"), "param": None}
                return web.json_response({"error": error}, status=status)
            body = {
                "id": "fake",
                "object": "chat.completion" if endpoint == "chat" else "text_completion",
                "model": payload.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": _usage_object(endpoint, prompt, cached, 1),
            }
            return web.json_response(body, status=status)
        chunks = int(ctl.get("chunks", s.chunks))
        interval = float(ctl.get("interval", s.interval))
        pad = int(ctl.get("pad", 0))  # extra bytes per chunk, to stream megabytes
        padding = b": " + b"x" * pad + b"\n" if pad else b""  # an SSE comment line
        die_after = ctl.get("die_after")
        resp = web.StreamResponse(status=status, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if first_after := float(ctl.get("first_after", 0)):
            await asyncio.sleep(first_after)  # the head is out; the first token takes its time (prefill)
        if "hold_first" in ctl:
            await s._hold(str(ctl["hold_first"])).wait()
        for i in range(chunks):
            if die_after is not None and i >= int(die_after):
                assert request.transport is not None
                request.transport.abort()  # the worker "dies": no [DONE], no chunk terminator
                return resp
            s.chunks_written = i + 1
            data = padding + (_stamped(i) if s.stamp else chunk_bytes(i, endpoint))
            await resp.write(with_usage(data, prompt, cached, i + 1) if counted else data)
            if interval:
                await asyncio.sleep(interval)
        s.served += 1
        # Leave before the last byte goes out: the proxy may admit the next request as soon
        # as it sees the end, and that must never look like over-admission here.
        _leave(s)
        left = True
        final = final_event(endpoint, chunks, int(ctl.get("final_pad", 0)))
        if counted:
            final = with_usage(final, prompt, cached, chunks)
        linger, split = float(ctl.get("linger", 0)), int(ctl.get("split", 1))
        if linger or split > 1:
            step = -(-len(final) // split)
            for i in range(0, len(final), step):
                if i:
                    await asyncio.sleep(0.02)  # long enough for the proxy to read each piece on its own
                await resp.write(final[i:i + step])
            await asyncio.sleep(linger)
            await resp.write_eof()
        else:
            await resp.write_eof(final)
        return resp
    except asyncio.CancelledError:
        s.cancelled += 1
        raise
    finally:
        if not left:
            _leave(s)


async def count_tokens(request: web.Request) -> web.Response:
    """As the worker does: counted at once, no sequence slot taken."""
    return web.json_response({"input_tokens": len(await request.read())})


async def health(request: web.Request) -> web.Response:
    s = request.app[FAKE]
    return web.json_response({"status": "ok" if s.health_status == 200 else "unhealthy"}, status=s.health_status)


async def identity(request: web.Request) -> web.Response:
    s = request.app[FAKE]
    s.identity_requests += 1
    if s.identity is None:
        raise web.HTTPNotFound()
    return web.json_response(s.identity)


async def metrics(request: web.Request) -> web.Response:
    s = request.app[FAKE]
    s.metrics_requests += 1
    if s.metrics is None:
        raise web.HTTPNotFound()
    return web.Response(text=s.metrics, content_type="text/plain")


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[FAKE].stats())


async def _events_ctx(app: web.Application):
    app[FAKE].freed = asyncio.Event()
    yield


def make_app(state: FakeState) -> web.Application:
    app = web.Application()
    app[FAKE] = state
    app.cleanup_ctx.append(_events_ctx)
    # Every endpoint a worker serves, answered in the chat shape whatever its API (the proxy only relays).
    for endpoint in ENDPOINTS:
        app.router.add_post(endpoint.path, completions if endpoint.generates else count_tokens)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_get("/identity", identity)
    app.router.add_get("/metrics", metrics)
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devkit.fake_upstream", description="A scripted OpenAI upstream that counts its own concurrency.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--gate", type=int, default=1, help="concurrent requests served; more are refused with 429 (default: 1)")
    ap.add_argument("--chunks", type=int, default=8, help="SSE chunks per streamed answer (default: 8)")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds between chunks (default: 0)")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds before answering (default: 0)")
    ap.add_argument("--name", default="fake")
    ap.add_argument("--stamp", action="store_true", help='put the send time (time.monotonic()) in each chunk as "t"')
    args = ap.parse_args(argv)
    state = FakeState(gate=args.gate, name=args.name, chunks=args.chunks, interval=args.interval, delay=args.delay, stamp=args.stamp)
    # Headers as long as a real worker reads (`MAX_HEADER_BYTES`), so what the proxy passes on arrives.
    web.run_app(make_app(state), host=args.host, port=args.port, access_log=None, print=None, handler_cancellation=True,
                max_field_size=MAX_HEADER_BYTES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
