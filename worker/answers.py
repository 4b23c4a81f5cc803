"""A generation written out as its answer: one JSON body, a stream of Chat Completions or Completions
chunks, the Responses API's output or Anthropic's message (whole or as events). Every answer carries the request's
`X-Request-Id`; a generation that failed ends as a 500 before the first byte, or as a last error
event after it. A client that leaves mid-stream ends its stream quietly: the handler then cancels
the sequence."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from mtpstack.refusals import stream_error
from mtpstack.worker.generation import Event, RequestHandle
from mtpstack.worker.http import REQUEST_ID, generation_failed
from mtpstack.worker.protocol import messages_answer, render, responses
from mtpstack.worker.parsing import ParsedRequest
from mtpstack.worker.sse import DONE, PING, frame, keepalive, open_stream


def _usage(parsed: ParsedRequest, seqs: list) -> dict:
    """The prompt counted once (its choices share one prefill), the completions of every choice."""
    completion = sum(len(seq.tokens) for seq in seqs)
    return {
        "prompt_tokens": len(parsed.prompt),
        "completion_tokens": completion,
        "total_tokens": len(parsed.prompt) + completion,
        "prompt_tokens_details": {"cached_tokens": seqs[0].cached_tokens},
        # Extensions: how much of the output the drafter proposed and the target kept.
        "draft_tokens": sum(seq.drafted for seq in seqs),
        "accepted_draft_tokens": sum(seq.accepted for seq in seqs),
    }


def _seq_usage(parsed: ParsedRequest, handle: RequestHandle) -> Callable[[], tuple[int, int, int]]:
    """The tokens one sequence has used so far, for the stream's usage comment (`mtpstack.usage`)."""
    return lambda: (len(parsed.prompt), handle.seq.cached_tokens, len(handle.seq.tokens))


def _ids(kind: str) -> tuple[str, str, int]:
    prefix, obj = ("chatcmpl", "chat.completion") if kind == "chat" else ("cmpl", "text_completion")
    return f"{prefix}-{uuid.uuid4().hex[:24]}", obj, int(time.time())


def _logprobs(parsed: ParsedRequest, entries: list, tokenizer, offset: int = 0):
    """The answer's `logprobs` for these tokens in the request's shape; None when not asked for."""
    shape = parsed.agent.logprobs_shape if parsed.agent else None
    if shape == "chat":
        return {"content": render.chat_logprobs(entries, tokenizer)}
    if shape == "completion":
        return render.completion_logprobs(entries, tokenizer, offset)
    return None


async def _drain(handle: RequestHandle) -> tuple[str, list, Event]:
    parts, entries = [], []
    while True:
        event = await handle.events.get()
        parts.append(event.text)
        entries += event.logprobs
        if event.finish_reason is not None:
            return "".join(parts), entries, event


async def collect(parsed: ParsedRequest, handles: list[RequestHandle], name: str) -> web.Response:
    """The whole answer as one JSON body, once every choice has finished; `name` is the served model's."""
    results = await asyncio.gather(*(_drain(h) for h in handles))
    for _, _, event in results:
        if event.error:
            return generation_failed(event.error, handles[0].rid).response(handles[0].rid)
    rid, obj, created = _ids(parsed.kind)
    tokenizer = handles[0].seq.engine.tokenizer
    choices = []
    for index, (text, entries, event) in enumerate(results):
        logprobs = _logprobs(parsed, entries, tokenizer)
        if parsed.kind == "chat":
            answer = render.ChatText(parsed.agent.output)
            answer.feed(text)
            answer.finish()
            choices.append({"index": index, "message": answer.message(), "logprobs": logprobs,
                            "finish_reason": answer.finish_reason(event.finish_reason)})
        else:
            choices.append({"index": index, "text": text, "logprobs": logprobs, "finish_reason": event.finish_reason})
    return web.json_response(
        {"id": rid, "object": obj, "created": created, "model": name, "choices": choices,
         "usage": _usage(parsed, [h.seq for h in handles])},
        headers={REQUEST_ID: handles[0].rid},
    )


async def _merged(handles: list[RequestHandle]):
    """Every choice's events as `(index, event)`, in arrival order, until each has finished."""
    if len(handles) == 1:
        while True:
            event = await handles[0].events.get()
            yield 0, event
            if event.finish_reason is not None:
                return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, handle: RequestHandle) -> None:
        while True:
            event = await handle.events.get()
            queue.put_nowait((index, event))
            if event.finish_reason is not None:
                return

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    remaining = len(handles)
    try:
        while remaining:
            index, event = await queue.get()
            yield index, event
            remaining -= event.finish_reason is not None
    finally:
        for t in tasks:
            t.cancel()


async def stream(request: web.Request, parsed: ParsedRequest, handles: list[RequestHandle], name: str) -> web.StreamResponse:
    """Chunks as the text arrives (each choice's under its `index`), then the usage when asked for,
    then `data: [DONE]` (not after an error)."""
    rid, obj, created = _ids(parsed.kind)
    obj += ".chunk" if parsed.kind == "chat" else ""
    handle = handles[0]
    tokenizer = handle.seq.engine.tokenizer
    resp = None
    texts = [render.ChatText(parsed.agent.output) if parsed.kind == "chat" else None for _ in handles]
    sent = [0] * len(handles)  # characters of text answered so far per choice (completions' `text_offset`)

    def chunk(index: int, delta_or_text, finish: str | None, logprobs=None) -> bytes:
        if parsed.kind == "chat":
            choice = {"index": index, "delta": delta_or_text, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": delta_or_text or "", "logprobs": logprobs, "finish_reason": finish}
        payload = {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice]}
        if parsed.include_usage:
            payload["usage"] = None
        return frame(payload)

    async def write(index: int, event: Event, finish: str | None) -> None:
        answer = texts[index]
        logprobs = _logprobs(parsed, event.logprobs, tokenizer, sent[index]) if event.logprobs else None
        if answer is None:
            if event.text or logprobs or finish:
                await resp.write(chunk(index, event.text, finish, logprobs))
            sent[index] += len(event.text)
            return
        deltas = answer.feed(event.text)
        if finish is not None:
            deltas += answer.finish()
        if logprobs and not deltas:
            deltas = [{}]  # logprobs of text still held back travel on their own
        for i, delta in enumerate(deltas):
            await resp.write(chunk(index, delta, None, logprobs if i == 0 else None))
        if finish is not None:
            await resp.write(chunk(index, {}, answer.finish_reason(finish)))

    try:
        resp = await open_stream(request, handle.rid, lambda: (len(parsed.prompt), handle.seq.cached_tokens,
                                                               sum(len(h.seq.tokens) for h in handles)))
        failed = None
        async with keepalive(resp):
            for index, answer in enumerate(texts):
                if answer is not None:
                    await resp.write(chunk(index, {"role": "assistant", "content": ""}, None))
            async for index, event in _merged(handles):
                if event.error:
                    failed = event.error
                    break
                await write(index, event, event.finish_reason)
        if failed is not None:
            await resp.write(frame(generation_failed(failed, handle.rid).body()))
        elif parsed.include_usage:
            await resp.write(frame({"id": rid, "object": obj, "created": created, "model": name, "choices": [],
                                    "usage": _usage(parsed, [h.seq for h in handles])}))
        await resp.write(DONE)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client left mid-stream
    # Left before the stream opened: aiohttp finds the connection closed and drops this quietly.
    return resp if resp is not None else web.Response()


def event_writer(resp: web.StreamResponse | None) -> Callable[[list[dict]], Awaitable[None]]:
    """`send(events)`: each event framed under its `type` name on the stream `resp`; nothing when the
    answer is not streamed (`resp` None)."""
    async def send(events: list[dict]) -> None:
        for e in events if resp is not None else ():
            await resp.write(frame(e, event=e["type"]))
    return send


async def respond_to_responses(request: web.Request, parsed: ParsedRequest, handle: RequestHandle) -> web.StreamResponse:
    """`/v1/responses`: the same generation, answered as Responses output items or stream events."""
    builder = parsed.builder
    resp = None
    try:
        resp = await open_stream(request, handle.rid, _seq_usage(parsed, handle)) if parsed.stream else None
        send = event_writer(resp)
        async with keepalive(resp):
            await send(builder.start())
            while True:
                event = await handle.events.get()
                if event.finish_reason is not None:
                    break
                await send(builder.feed(event.text))
        if event.error:
            err = generation_failed(event.error, handle.rid)
            if resp is None:
                return err.response(handle.rid)
            name, data = stream_error("responses", err.status, err.code, err.message, builder.seq + 1)
            await resp.write(frame(data, event=name))
        else:
            seq = handle.seq
            usage = responses.usage(len(parsed.prompt), len(seq.tokens), seq.cached_tokens)
            events = builder.feed(event.text) + builder.finish(event.finish_reason, usage)
            if resp is None:
                return web.json_response(events[-1]["response"], headers={REQUEST_ID: handle.rid})
            await send(events)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client left mid-stream
    # Left before the stream opened: aiohttp finds the connection closed and drops this quietly.
    return resp if resp is not None else web.Response()


async def respond_to_messages(request: web.Request, parsed: ParsedRequest, handle: RequestHandle) -> web.StreamResponse:
    """`/v1/messages`: the same generation, answered as Anthropic's message or its stream events.
    `message_start` goes out once the prompt is prefilled, so its usage says how much of the prompt
    the prefix cache served; until then (and whenever the stream is quiet) `ping` events keep it
    alive. A failure before the first byte is an error in Anthropic's shape."""
    builder = parsed.builder
    prompt = len(parsed.prompt)
    resp = None
    try:
        resp = await open_stream(request, handle.rid, _seq_usage(parsed, handle)) if parsed.stream else None
        send = event_writer(resp)
        async with keepalive(resp, beat=PING):
            event = await handle.events.get()  # the first comes once the prompt is prefilled
            await send(builder.start(messages_answer.usage(prompt, 0, handle.seq.cached_tokens)))
            while event.finish_reason is None:
                await send(builder.feed(event.text))
                event = await handle.events.get()
        seq = handle.seq
        if event.error:
            err = generation_failed(event.error, handle.rid)
            if resp is None:
                return err.response(handle.rid, "anthropic")
            name, data = stream_error("messages", err.status, err.code, err.message, family="anthropic")
            await resp.write(frame(data, event=name))
        else:
            stop = None
            if event.finish_reason == "stop" and builder.stops:
                stop = messages_answer.matched_stop(builder.stops, seq.engine.tokenizer.decode(seq.tokens), seq.text)
            usage = messages_answer.usage(prompt, len(seq.tokens), seq.cached_tokens)
            events = builder.feed(event.text) + builder.finish(event.finish_reason, usage, stop)
            if resp is None:
                return web.json_response(builder.message(event.finish_reason, usage, stop), headers={REQUEST_ID: handle.rid})
            await send(events)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client left mid-stream
    # Left before the stream opened: aiohttp finds the connection closed and drops this quietly.
    return resp if resp is not None else web.Response()
