"""The worker's routes: the completion APIs (one handler per row of the endpoint table,
`mtpstack.endpoints`, each speaking its API through a `Surface`), which admit a request into a
sequence slot (waiting a short grace for one, then 429 `worker_full`) and hand it to the generation
thread, and the status endpoints `/health`, `/identity`, `/v1/models` and `/metrics`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mtpstack.endpoints import Endpoint
from mtpstack.validator import BodyError, parse_json_body
from mtpstack.worker import answers
from mtpstack.worker.classify import CLASS_HEADER
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.generation import GenerationLoop, RequestHandle
from mtpstack.worker.http import (REQUEST_ID, ApiError, bad_request, body_too_large, generation_failed, model_not_found,
                                  request_id)
from mtpstack.worker.identity import STARTED_AT
from mtpstack.worker.metrics import Metrics
from mtpstack.worker.protocol import messages, messages_answer, responses
from mtpstack.worker.protocol.chat import ProtocolError, compile_constraint
from mtpstack.worker.parsing import SEED_LIMIT, ContextExceeded, ParsedRequest, count_prompt, parse_request
from mtpstack.worker.protocol.grammar import Busy

log = logging.getLogger("mtpstack.worker")

# What the handlers read from the app; `mtpstack.worker.server` fills them in.
CONFIG = web.AppKey("config", WorkerConfig)
GEN = web.AppKey("generation", GenerationLoop)
METRICS = web.AppKey("metrics", Metrics)
SLOTS = web.AppKey("slots", asyncio.Semaphore)
#: One thread that parses and checks large bodies (`INLINE_PARSE_BYTES`), off the event loop.
PARSER = web.AppKey("parser", ThreadPoolExecutor)

#: A body larger than this is parsed and checked on the `PARSER` thread instead of the event loop.
#: A 45 KB schema costs 5-13 ms of the loop (JSON, its bounds, the template: 2 shared cores), so a
#: burst of 120 held `/health` for a second; a small body costs less than the hand-over.
INLINE_PARSE_BYTES = 16 * 1024


def _loaded(app: web.Application) -> GenerationLoop:
    gen = app[GEN]
    if gen.load_error is not None:
        raise ApiError(503, "load_failed", f"the worker failed to load its models: {gen.load_error}")
    if not gen.loaded.is_set():
        raise ApiError(503, "loading", "the worker is still loading its models")
    if not gen.alive:
        raise ApiError(503, "loop_dead", f"the worker's generation loop is not running: {gen.fatal}")
    return gen


async def health(request: web.Request) -> web.Response:
    app = request.app
    gen, config = app[GEN], app[CONFIG]
    body = {"max_num_seqs": config.max_num_seqs, "active": gen.active_count}
    if gen.load_error is not None:
        return web.json_response({**body, "status": "error", "error": str(gen.load_error)}, status=503)
    if not gen.loaded.is_set():
        return web.json_response({**body, "status": "loading"}, status=503)
    if not gen.alive:
        return web.json_response({**body, "status": "dead"}, status=503)
    since = time.monotonic() - gen.last_progress
    if gen.busy() and since > config.stall_seconds:
        return web.json_response({**body, "status": "stalled", "seconds_since_progress": round(since, 1)}, status=503)
    return web.json_response({**body, "status": "ok"})


async def reachable(request: web.Request) -> web.Response:
    """A client's reachability probe (`mtpstack.endpoints.REACHABILITY_PATHS`; HEAD too): the service answers."""
    return web.json_response({"status": "ok"})


async def identity(request: web.Request) -> web.Response:
    try:
        gen = _loaded(request.app)
    except ApiError as e:
        return e.response()
    return web.json_response(gen.identity)


def _model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": int(STARTED_AT), "owned_by": "mtpstack"}


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_object(request.app[CONFIG].served_model_name)]})


async def model(request: web.Request) -> web.Response:
    """The one entry of `/v1/models` (OpenAI's `models.retrieve`), or a JSON 404."""
    name, asked = request.app[CONFIG].served_model_name, request.match_info["model"]
    if asked != name:
        return model_not_found(name, asked).response()
    return web.json_response(_model_object(name))


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})


@dataclass(frozen=True)
class Surface:
    """How the one completion path serves an API (an endpoint's `api`): the prompt it renders, and the
    steps where the API differs from chat completions (each None for chat completions' own)."""

    #: `chat` (messages through the chat template) or `text` (a completion prompt).
    kind: str
    #: A body in this API's shape -> a chat completion body; raises `ProtocolError` naming the field.
    to_chat: Callable[[dict], dict] | None = None
    #: A refusal of the translated body, reworded to name the field the client sent: (param, message) -> same.
    reword: Callable[[str | None, str], tuple[str | None, str]] | None = None
    #: What writes this API's answer, from the parsed request, the served model name and the original body.
    builder: Callable[[ParsedRequest, str, dict], object] | None = None
    #: Writes the answer: (request, parsed, handles, served model name) -> response.
    respond: Callable[..., Awaitable[web.StreamResponse]] | None = None


async def _chat_answer(request: web.Request, parsed: ParsedRequest, handles: list, name: str) -> web.StreamResponse:
    if parsed.stream:
        return await answers.stream(request, parsed, handles, name)
    return await answers.collect(parsed, handles, name)


#: Each generating API by `Endpoint.api` (`mtpstack.endpoints`).
SURFACES: dict[str, Surface] = {
    "chat": Surface("chat"),
    "completions": Surface("text"),
    "responses": Surface(
        "chat",
        to_chat=responses.to_chat,
        reword=responses.responses_refusal,
        builder=lambda parsed, name, original: responses.ResponseBuilder(parsed.agent.output, name, original),
        respond=lambda request, parsed, handles, name: answers.respond_to_responses(request, parsed, handles[0]),
    ),
    "messages": Surface(
        "chat",
        to_chat=messages.to_chat,
        reword=messages.messages_refusal,
        builder=lambda parsed, name, original: messages_answer.MessageBuilder.for_request(parsed.agent.output, name, original),
        respond=lambda request, parsed, handles, name: answers.respond_to_messages(request, parsed, handles[0]),
    ),
}


def route(endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of one row of the endpoint table: a completion in the row's API, or (a row that
    does not generate) the count of the prompt it would render."""
    surface = SURFACES[endpoint.api]
    if not endpoint.generates:
        return _counter(endpoint, surface)

    async def handle(request: web.Request) -> web.StreamResponse:
        return await _completion(request, endpoint, surface)

    handle.__name__ = handle.__qualname__ = f"{endpoint.api}_completion"
    return handle


def _counter(endpoint: Endpoint, surface: Surface) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def count_tokens(request: web.Request) -> web.Response:
        """`{"input_tokens": N}`: the prompt a request in `surface`'s API renders to; no slot taken."""
        rid = request_id(request.headers)
        try:
            gen = _loaded(request.app)
            chat = _translated(_json(await _read(request)), surface)
            count = count_prompt(chat, gen.engine, request.app[CONFIG])
        except ApiError as e:
            if surface.reword is not None:
                e.param, e.message = surface.reword(e.param, e.message)
            return e.response(rid, endpoint.family)
        return web.json_response({"input_tokens": count}, headers={REQUEST_ID: rid})

    return count_tokens


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise body_too_large() from None


def _json(raw: bytes):
    try:
        return parse_json_body(raw)
    except BodyError as e:
        raise bad_request(str(e)) from None


def _translated(body, surface: Surface) -> dict:
    """The chat completion body a request in `surface`'s API means."""
    if surface.to_chat is None:
        return body
    try:
        return surface.to_chat(body)
    except ProtocolError as e:
        raise ApiError(400, e.code, e.message, e.param) from None


async def _completion(request: web.Request, endpoint: Endpoint, surface: Surface) -> web.StreamResponse:
    """Every answer carries the request's `X-Request-Id` (the proxy's, echoed), so a failure
    seen by a client can be found in both logs."""
    app = request.app
    rid = request_id(request.headers)
    try:
        gen = _loaded(app)
        raw = await _read(request)
        args = (raw, surface, gen, app[CONFIG], request.headers.get(CLASS_HEADER))
        if len(raw) <= INLINE_PARSE_BYTES:
            original, parsed = _parse(*args)
        else:
            original, parsed = await asyncio.get_running_loop().run_in_executor(app[PARSER], _parse, *args)
        if parsed.agent is not None:
            try:
                # Off the loop, in this client's turn: a schema stalls no one, a flood only its sender.
                await compile_constraint(parsed.agent, gen.engine, request.remote or "")
            except ProtocolError as e:
                raise ApiError(400, e.code, e.message, e.param) from None
            except Busy as e:
                raise ApiError(e.status, "worker_busy", e.message) from None
        if surface.builder is not None:
            parsed.builder = surface.builder(parsed, app[CONFIG].served_model_name, original)
    except ApiError as e:
        if isinstance(e, ContextExceeded):
            e.param, e.message = e.worded(endpoint.api)
        if surface.reword is not None:
            e.param, e.message = surface.reword(e.param, e.message)
        if e.status in (400, 404, 413) or e.code == "worker_busy":
            app[METRICS].rejected.labels(code=e.code).inc()
        return e.response(rid, endpoint.family)

    slots = app[SLOTS]
    config = app[CONFIG]
    taken = 0  # slots held, one per choice (`n`): each choice is a row of the batch
    deadline = asyncio.get_running_loop().time() + config.admission_grace_seconds
    try:
        while taken < parsed.n:
            await asyncio.wait_for(slots.acquire(), timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
            taken += 1
    except asyncio.TimeoutError:
        for _ in range(taken):
            slots.release()
        app[METRICS].rejected.labels(code="worker_full").inc()
        wanted = f"{parsed.n} of its {config.max_num_seqs}" if parsed.n > 1 else f"all {config.max_num_seqs}"
        return ApiError(
            429, "worker_full",
            f"{wanted} sequence slots are busy" if parsed.n == 1 else f"{wanted} sequence slots are not free",
        ).response(rid, endpoint.family)

    try:
        handles = [_handle(gen, parsed, i, slots, rid) for i in range(parsed.n)]
    except Exception as e:  # nothing was submitted: give the slots back
        for _ in range(taken):
            slots.release()
        log.exception("request %s: the sequence could not be created", rid)
        return generation_failed(e, rid).response(rid, endpoint.family)
    app[METRICS].requests_by_class.labels(parsed.cls).inc()
    submitted = 0
    try:
        # All at once: the choices share one prefill (the scheduler lets the others resume from the
        # first's snapshot a token before the prompt's end, cache or no cache) and start together.
        for h in handles:
            gen.submit(h)
            submitted += 1
        return await (surface.respond or _chat_answer)(request, parsed, handles, config.served_model_name)
    finally:
        for _ in handles[submitted:]:
            slots.release()  # never reached the generation thread, which would have released it
        for h in handles[:submitted]:
            if not h.done:
                # The client went away (or writing failed): stop generating. The slot is
                # released when the generation thread drops the sequence, within one step.
                h.seq.cancelled = True


def _parse(raw: bytes, surface: Surface, gen: GenerationLoop, config: WorkerConfig, class_header: str | None):
    """(the body as sent, the request checked): every refusal an `ApiError`. On the loop or the parse thread."""
    original = _json(raw)
    return original, parse_request(_translated(original, surface), surface.kind, gen.engine, config, class_header)


def _handle(gen: GenerationLoop, parsed, i: int, slots: asyncio.Semaphore, rid: str) -> RequestHandle:
    """Choice `i`'s sequence: its own hook (a grammar's state, logprobs) and, when seeded, its own seed."""
    params = parsed.params
    if i and params.seed is not None:
        params = dataclasses.replace(params, seed=(params.seed + i) % SEED_LIMIT)
    seq = gen.engine.new_sequence(parsed.prompt, params)
    if parsed.agent is not None:
        seq.snapshot_at = set(parsed.agent.boundaries)
        seq.hook = parsed.agent.hook if i == 0 or parsed.agent.hook is None else parsed.agent.hook.fork()
    else:
        seq.hook = None
    handle = RequestHandle(seq=seq, loop=asyncio.get_running_loop(), release=slots.release, rid=rid, cls=parsed.cls)
    seq.handle = handle
    return handle
