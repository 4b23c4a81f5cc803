"""The multi-turn driver (`mtpstack.bench.conversations`) against a scripted server: each turn's row, a
conversation fed its answers, and failures as rows."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from mtpstack.bench import conversations as cv
from mtpstack.bench import workloads as wl


async def served(handler, body):
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        return await body(f"http://127.0.0.1:{port}/v1")
    finally:
        await runner.cleanup()


def chunk(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_a_conversation_fed_its_answers_is_timed_turn_by_turn_and_failures_are_rows():
    seen = []

    async def handler(request):
        body = await request.json()
        seen.append(body)
        if body["messages"][-1]["content"] == "fail":
            return web.Response(status=429, text="busy")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk({"choices": [{"delta": {"reasoning_content": "hm"}}]}))
        await resp.write(chunk({"choices": [{"delta": {"content": f"answer {len(seen)}"}}]}))
        await resp.write(chunk({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                                                         "prompt_tokens_details": {"cached_tokens": 4}}}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    session = wl.conversation(0, "system", "q", 3)
    failing = wl.Session(1, 0.0, [wl.Turn([{"role": "user", "content": "fail"}], 0.0)])
    rows = asyncio.run(served(handler, lambda url: cv.run_sessions(url, "m", [session, failing], 8, labels={"stack": "s"},
                                                                   tag="t", extra={"ignore_eos": True})))
    ok = [r for r in rows if r["session"] == 0]
    assert [(r["turn"], r["status"], r["prompt_tokens"], r["cached_tokens"], r["completion_tokens"]) for r in ok] == [
        (1, "ok", 10, 4, 2), (2, "ok", 10, 4, 2), (3, "ok", 10, 4, 2)]
    assert all(r["stack"] == "s" and 0 <= r["ttft_s"] <= r["total_s"] for r in ok)
    third = next(b for b in seen if len(b["messages"]) == 6)
    assert [m["content"] for m in third["messages"] if m["role"] == "assistant"][0].startswith("answer")
    assert third["ignore_eos"] is True and third["stream_options"] == {"include_usage": True}
    (bad,) = [r for r in rows if r["session"] == 1]
    assert (bad["status"], bad["http_status"], bad["ttft_s"], bad["request_id"]) == ("429", 429, None, "t-1-1")
    try:
        cv.answered(rows)
    except RuntimeError as e:
        assert "t-1-1: 429" in str(e)
    else:
        raise AssertionError("a failed turn passed")
