"""The worker's HTTP API: aiohttp on the event loop, one generation thread running the scheduler.

The event loop parses requests, admits them into at most `max_num_seqs` slots
(waiting a short grace for one, then 429 `worker_full`), and streams text back.
The generation thread owns mlx: it loads the models, then repeatedly admits
queued sequences and calls `Scheduler.step()`. Results cross back with
`loop.call_soon_threadsafe`; a finished sequence's slot is released there,
before its last chunk is written. A client that goes away marks its sequence
cancelled, and the scheduler drops it before its next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import platform
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mtpstack.proxy.http import REQUEST_ID, request_id
from mtpstack.validator.bounds import BodyError, parse_json_body
from mtpstack.validator.config import DEPTH_DEFAULT
from mtpstack.validator.modeldir import config_value
from mtpstack.worker.classify import CLASS_FIELD, CLASS_HEADER, CLASS_PATTERN, CODE, PROSE, classify_request
from mtpstack.worker.proof import read_cmdline
from mtpstack.worker.protocol import render, responses
from mtpstack.worker.protocol.chat import AgentRequest, ProtocolError, prepare

log = logging.getLogger("mtpstack.worker")

#: Test-only hook: while the file this variable names exists, the generation loop
#: does not step (it still admits), so tests can hold sequences in flight and see
#: `/health` report a stall. Never set it in production.
STALL_FILE_ENV = "MTPSTACK_WORKER_TEST_STALL_FILE"
#: Test-only hook: seconds the generation thread waits before loading, so tests can
#: see `/health` answer 503 `loading` with models that load in milliseconds.
LOAD_DELAY_ENV = "MTPSTACK_WORKER_TEST_LOAD_DELAY"
#: Output tokens when a request sets no `max_tokens` (capped by the context left).
DEFAULT_MAX_TOKENS = 512
#: How long the idle generation thread blocks on its inbox before re-checking shutdown.
IDLE_POLL = 0.05
#: On SIGTERM, in-flight responses get this long to finish before their connections close.
SHUTDOWN_GRACE = 5.0
#: Seconds a rejected client is told to wait.
RETRY_AFTER = 1
#: Parameters that would change the response's shape or meaning, refused rather than ignored.
UNSUPPORTED_IF_SET = ("functions", "function_call", "suffix", "echo")
#: Largest integer accepted in a count (`max_tokens`, `n`, `num_draft_tokens`): mlx indexes
#: with 32-bit integers, and no context comes near it.
MAX_COUNT = 2**31 - 1
#: Seeds become a 64-bit mlx random key: 0 <= seed < 2^63, as mlx-lm's own server takes them.
SEED_LIMIT = 2**63
#: Largest request body the worker reads; the proxy's own limit (`proxy.maxBodyBytes`) is lower.
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass
class WorkerConfig:
    model: str
    draft_model: str | None = None
    draft_depth: int = DEPTH_DEFAULT
    #: `--draft-depth-map`: the depth per workload class; `draft_depth` is the depth of every other class.
    draft_depth_map: dict[str, int] = field(default_factory=dict)
    draft_kind: str = "auto"
    target_bits: str | None = None
    drafter_bits: str | None = None
    max_num_seqs: int = 1
    #: `--max-context-tokens`: caps the model's own context (None: the model's own maximum).
    max_context_tokens: int | None = None
    served_model_name: str = "default"
    host: str = "127.0.0.1"
    port: int = 8000
    admission_grace_seconds: float = 1.0
    stall_seconds: float = 30.0
    default_max_tokens: int = DEFAULT_MAX_TOKENS


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, param: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def response(self, rid: str | None = None) -> web.Response:
        body = self.body()
        headers = {hdrs.RETRY_AFTER: str(RETRY_AFTER)} if self.status in (429, 503) else {}
        if rid is not None:
            headers[REQUEST_ID] = rid
        return web.json_response(body, status=self.status, headers=headers)


# -- metrics ---------------------------------------------------------------------------


class Metrics:
    """The `/metrics` names promised in docs/briefs (prefix `mtpstack_worker_`), one registry per app."""

    def __init__(self, max_depth: int):
        self.registry = CollectorRegistry()
        r = self.registry
        self.generated = Counter("mtpstack_worker_tokens_generated", "Tokens emitted to clients.", registry=r)
        self.drafted = Counter("mtpstack_worker_tokens_drafted", "Tokens proposed by the drafter.", registry=r)
        self.accepted = Counter("mtpstack_worker_tokens_accepted", "Drafted tokens the target confirmed.", registry=r)
        self.by_position = Counter(
            "mtpstack_worker_accepted_by_position",
            "Drafted tokens accepted, by position in the draft (1 = first).",
            ["position"],
            registry=r,
        )
        self.drafted_by_position = Counter(
            "mtpstack_worker_drafted_by_position",
            "Tokens drafted, by position in the draft (1 = first): acceptance at a position is accepted over drafted there.",
            ["position"],
            registry=r,
        )
        self.per_step = Histogram(
            "mtpstack_worker_accepted_per_step",
            "Drafted tokens accepted per draft-and-verify step.",
            buckets=[float(i) for i in range(max(max_depth, 1) + 1)],
            registry=r,
        )
        self.active = Gauge("mtpstack_worker_active_sequences", "Sequences admitted and not finished.", registry=r)
        self.rejected = Counter("mtpstack_worker_rejected", "Requests refused, by error code.", ["code"], registry=r)
        self.drafter = Gauge(
            "mtpstack_worker_drafter_info",
            "The loaded drafter: kind mtp (an MTP head) or model (a separate draft model), 1 while loaded.",
            ["kind", "bundled", "depth"],
            registry=r,
        )
        self.target_steps = Counter(
            "mtpstack_worker_target_steps",
            "Target decode steps: one batched forward that drafts and verifies every decoding row, at any width.",
            registry=r,
        )
        self.requests_by_class = Counter(
            "mtpstack_worker_requests_by_class", "Requests admitted, by workload class.", ["class"], registry=r
        )
        self.drafted_by_class = Counter(
            "mtpstack_worker_tokens_drafted_by_class", "Tokens proposed by the drafter, by workload class.", ["class"], registry=r
        )
        self.accepted_by_class = Counter(
            "mtpstack_worker_tokens_accepted_by_class", "Drafted tokens the target confirmed, by workload class.", ["class"], registry=r
        )
        for position in range(1, max_depth + 1):
            self.by_position.labels(position=str(position))
            self.drafted_by_position.labels(position=str(position))
        self.rejected.labels(code="worker_full")

    def drafter_info(self, engine) -> None:
        if engine.drafter is not None:
            self.drafter.labels(kind=engine.draft_kind, bundled=str(engine.drafter.bundled).lower(),
                                depth=str(engine.draft_depth)).set(1)

    def record_step(self, drafted: int, accepted: int, tokens: int, cls: str | None = None) -> None:
        if drafted and cls is not None:
            self.drafted_by_class.labels(cls).inc(drafted)
            self.accepted_by_class.labels(cls).inc(accepted)
        if tokens:
            self.generated.inc(tokens)
        if drafted:
            self.drafted.inc(drafted)
            self.accepted.inc(accepted)
            self.per_step.observe(accepted)
            for position in range(1, drafted + 1):
                self.drafted_by_position.labels(position=str(position)).inc()
            for position in range(1, accepted + 1):
                self.by_position.labels(position=str(position)).inc()


# -- the bridge between the event loop and the generation thread -----------------------


@dataclass
class Event:
    text: str
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list = field(default_factory=list)  # mtpstack.worker.protocol.hooks.TokenLogprob, when asked for


@dataclass
class RequestHandle:
    """The event-loop side of one admitted sequence."""

    seq: object
    loop: asyncio.AbstractEventLoop
    release: object  # callable releasing the slot, run on the loop
    rid: str = ""  # the request's X-Request-Id, echoed on its answer and named in its errors
    cls: str | None = None  # the workload class, for the metrics by class
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    done: bool = False

    def deliver(self, event: Event) -> None:
        """Runs on the loop. The slot is released before the final event is seen by the writer."""
        if event.finish_reason is not None and not self.done:
            self.done = True
            self.release()
        self.events.put_nowait(event)


class GenerationLoop:
    """The one thread that touches mlx: loads the engine, then steps the scheduler forever."""

    def __init__(self, config: WorkerConfig, metrics: Metrics, loop: asyncio.AbstractEventLoop):
        self.config = config
        self.metrics = metrics
        self.loop = loop
        self.inbox: queue.Queue[RequestHandle] = queue.Queue()
        self.engine = None
        self.scheduler = None
        self.identity: dict | None = None
        self.load_error: BaseException | None = None
        self.fatal: BaseException | None = None
        self.loaded = threading.Event()
        self.last_progress = time.monotonic()
        self.active_count = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="generation", daemon=True)
        self.stall_file = os.environ.get(STALL_FILE_ENV) or None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def busy(self) -> bool:
        return self.active_count > 0 or not self.inbox.empty()

    def submit(self, handle: RequestHandle) -> None:
        self.inbox.put(handle)

    def _load(self) -> None:
        from mtpstack.worker.engine import Engine, Scheduler

        c = self.config
        started = time.monotonic()
        self.engine = Engine.load(
            # Loaded at the deepest class's depth; each request drafts at its own (`parse_request`).
            c.model, c.draft_model, draft_depth=max([c.draft_depth, *c.draft_depth_map.values()]),
            target_bits=c.target_bits, drafter_bits=c.drafter_bits, draft_kind=c.draft_kind,
        )
        # The one place the context is capped: every check reads `engine.context_length`.
        self.engine.context_length = effective_context(self.engine.context_length, c.max_context_tokens)
        self.scheduler = Scheduler(c.max_num_seqs)
        self.identity = build_identity(c, self.engine)
        self.metrics.drafter_info(self.engine)
        log.info("loaded `%s` in %.2f s (drafter: %s, kind %s, depth %d, layers: %s)", c.model,
                 time.monotonic() - started, c.draft_model or "none", self.engine.draft_kind or "-",
                 self.engine.draft_depth, ", ".join(f"{k} x{self.engine.cache_kinds.count(k)}" for k in dict.fromkeys(self.engine.cache_kinds)))

    def _run(self) -> None:
        try:
            delay = float(os.environ.get(LOAD_DELAY_ENV) or 0)
            if delay > 0:
                self._stopping.wait(delay)
            self._load()
        except BaseException as e:  # reported by the CLI, which exits 1
            self.load_error = e
            self.loaded.set()
            return
        self.loaded.set()
        try:
            self._loop()
        except BaseException as e:  # never leave a client waiting on a dead loop
            log.exception("the generation loop died")
            self.fatal = e
            pending = list(self.scheduler.active)
            while not self.inbox.empty():
                pending.append(self.inbox.get_nowait().seq)
            for seq in pending:
                seq.finish_reason = seq.finish_reason or "error"
                if seq.handle is not None:
                    self.loop.call_soon_threadsafe(seq.handle.deliver, Event("", "error", f"the generation loop died: {e}"))

    def _loop(self) -> None:
        sched = self.scheduler
        while not self._stopping.is_set():
            self._admit(block=not sched.active)
            for seq in sched.drop_cancelled():
                self._publish(seq, None)
            self.active_count = len(sched.active)
            self.metrics.active.set(self.active_count)
            if not sched.active:
                self.last_progress = time.monotonic()
                continue
            if self.stall_file and os.path.exists(self.stall_file):
                time.sleep(IDLE_POLL)
                continue
            steps = sched.decode_steps
            results = sched.step()
            self.last_progress = time.monotonic()
            if sched.decode_steps > steps:
                self.metrics.target_steps.inc(sched.decode_steps - steps)
            for seq, result, error in results:
                if result is not None:
                    handle = getattr(seq, "handle", None)
                    self.metrics.record_step(result.drafted, result.accepted, result.tokens, getattr(handle, "cls", None))
                self._publish(seq, error)
            self.active_count = len(sched.active)
            self.metrics.active.set(self.active_count)

    def _admit(self, block: bool) -> None:
        try:
            handle = self.inbox.get(timeout=IDLE_POLL) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            handle.seq.handle = handle
            self.scheduler.add(handle.seq)
            self.active_count = len(self.scheduler.active)
            self.metrics.active.set(self.active_count)
            try:
                handle = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _publish(self, seq, error: BaseException | None) -> None:
        """Hand a sequence's new text (and its end) to its request. A failure here ends that
        sequence only: the loop, and every other sequence, goes on."""
        try:
            text = seq.take_text()
        except Exception as e:
            log.exception("request %s: its output could not be decoded", seq.handle.rid)
            text, error = "", error or e
            seq.finish_reason = "error"
            if seq in self.scheduler.active:
                self.scheduler.active.remove(seq)
        finish = seq.finish_reason
        logprobs = seq.hook.take() if seq.hook is not None else []
        if not text and finish is None and not logprobs:
            return
        if error is not None:
            log.error("request %s: generation failed: %s: %s", seq.handle.rid, type(error).__name__, error)
        event = Event(text=text, finish_reason=finish, error=f"{type(error).__name__}: {error}" if error else None,
                      logprobs=logprobs)
        self.loop.call_soon_threadsafe(seq.handle.deliver, event)


# -- identity --------------------------------------------------------------------------


def blas_in_use() -> str:
    """Which BLAS mlx runs matmuls with, as far as can be seen from inside the process.

    On Linux an OpenBLAS named in LD_PRELOAD and mapped into the process wins;
    numpy's own vendored OpenBLAS does not count, mlx never calls it.
    """
    if platform.system() == "Darwin":
        return "accelerate"
    try:
        mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/" in line}
    except OSError:
        return "unknown"
    for lib in os.environ.get("LD_PRELOAD", "").replace(" ", ":").split(":"):
        if lib and "blas" in lib.lower():
            real = os.path.realpath(lib)
            if lib in mapped or real in mapped:
                return real if real != lib else lib
    return "bundled (reference BLAS, slow)"


def effective_context(model_maximum: int | None, cap: int | None) -> int | None:
    """The context a request may use: the model's own maximum, lowered to `--max-context-tokens` when given."""
    if cap is None:
        return model_maximum
    return cap if model_maximum is None else min(model_maximum, cap)


def _context_name(config: WorkerConfig, ctx: int) -> str:
    """What limits the context, as an error message names it."""
    if config.max_context_tokens is not None and ctx == config.max_context_tokens:
        return "worker's context limit (`--max-context-tokens`)"
    return "model's context"


def build_identity(config: WorkerConfig, engine) -> dict:
    import mlx.core as mx
    import mlx_lm

    from mtpstack import __version__

    device = mx.default_device()
    return {
        "served_model_name": config.served_model_name,
        "backend": "native",
        "target": engine.target.identity(),
        "drafter": engine.drafter.identity() if engine.drafter is not None else None,
        "draft_depth": config.draft_depth if engine.drafter is not None else None,
        "draft_depth_map": dict(sorted(config.draft_depth_map.items())) if engine.drafter is not None else None,
        "max_num_seqs": config.max_num_seqs,
        "batched_verification": engine.batchable,
        "context_length": engine.context_length,
        "max_context_tokens": config.max_context_tokens,
        "device": "gpu" if device.type == mx.gpu else "cpu",
        "blas": blas_in_use(),
        "pid": os.getpid(),
        "started_at": STARTED_AT,
        "argv": _own_argv(),
        "versions": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "mtpstack": __version__},
    }


STARTED_AT = time.time()


def _own_argv() -> list[str]:
    # The same source `mtpstack weights` reads, so the two compare exactly.
    try:
        return read_cmdline(os.getpid())
    except (ProcessLookupError, OSError):
        import sys

        return list(sys.argv)


# -- request parsing ---------------------------------------------------------------------


@dataclass
class ParsedRequest:
    kind: str  # "chat" or "text"
    prompt: list[int]
    params: object  # engine.SamplingParams
    stream: bool
    include_usage: bool
    agent: AgentRequest | None = None  # tools, reasoning, logprobs, constrained output
    cls: str = "default"  # the workload class (`mtpstack.worker.classify`)
    responses: object = None  # mtpstack.worker.protocol.responses.ResponseBuilder for `/v1/responses`


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request", message, param)


def _unsupported(message: str, param: str) -> ApiError:
    return ApiError(400, "unsupported_parameter", message, param)


def _number(body: dict, key: str, kind, lo=None, hi=None):
    """`body[key]` as `kind` within [lo, hi] (either may be None: unbounded), or None when absent.
    Floats must be finite: NaN compares false with every bound and would slip through."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise _bad(f"`{key}` must be {'an integer' if kind is int else 'a number'}: {_shown(value)}", key)
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(f"`{key}` must be a finite number: {value!r}", key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _bad(f"`{key}` is out of range [{lo}, {hi}]: {_shown(value)}", key)
    return kind(value)


def _shown(value) -> str:
    """A client's value inside a message: short, so an error never echoes a megabyte back."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: str, param: str, where: str | None = None) -> str:
    """`value` unless it cannot be encoded (a lone surrogate such as `\\ud800`), which tokenizers reject."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"`{param}` holds text that is not valid Unicode (a lone surrogate){': ' + where if where else ''}", param) from None
    return value


def _flag(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"`{key}` must be a boolean: {_shown(value)}", key)
    return value


def _valid_unicode(body: dict) -> None:
    """Text that cannot be encoded (a lone surrogate such as `\\ud800`) is refused before any template or tokenizer sees it."""
    for key in ("messages", "tools", "tool_choice", "chat_template_kwargs", "response_format"):
        try:
            json.dumps(body.get(key), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(f"`{key}` holds text that is not valid Unicode (a lone surrogate)", key) from None


def vocab_size(engine) -> int | None:
    """Rows of the target's embedding: from config.json (or its `text_config`), else the table itself."""
    size = config_value(engine.target.config, "vocab_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    embed = getattr(getattr(engine.target.model, "model", None), "embed_tokens", None)
    weight = getattr(embed, "weight", None)
    return int(weight.shape[0]) if weight is not None else None


def _tokenize(make, param: str) -> list[int]:
    # The tokenizer and the chat template are third-party code fed client text; whatever they
    # refuse (a template's `raise_exception`, an input type they reject) is the client's to fix.
    try:
        return make()
    except Exception as e:
        raise _bad(f"`{param}` cannot be tokenized: {type(e).__name__}: {_shown(str(e))}", param) from None


def request_class(body: dict, header: str | None, config: WorkerConfig) -> str:
    """The class whose depth a request drafts at and whose series it counts in: its own (`mtpstack_class`,
    else `X-Mtpstack-Class`), else the classifier's. A class the map does not list counts as `default`
    (so clients cannot mint metric series), except the classifier's own `code` and `prose`."""
    named = body.get(CLASS_FIELD)
    param = CLASS_FIELD
    if named is None and header is not None:
        named, param = header, CLASS_HEADER
    if named is not None:
        if not isinstance(named, str) or not CLASS_PATTERN.fullmatch(named):
            raise _bad(f"`{param}` must be a class name of letters, digits, `_`, `.` and `-`: {_shown(named)}", param)
    cls = named if named is not None else classify_request(body)
    return cls if cls in config.draft_depth_map or cls in (CODE, PROSE) else "default"


def parse_request(body, kind: str, engine, config: WorkerConfig, class_header: str | None = None) -> ParsedRequest:
    """Every field checked before anything reaches mlx: a token id past the vocabulary crashes
    the process, an out-of-range seed or a NaN reaches native code; each refusal names its field."""
    from mtpstack.worker.engine import SamplingParams

    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad(f"`model` must be a string: {_shown(model)}", "model")
    if model is not None and model != config.served_model_name:
        shown = model if len(model) <= 100 else model[:100] + "..."
        raise ApiError(404, "model_not_found", f"this worker serves `{config.served_model_name}`, not: `{shown}`", "model")
    n = _number(body, "n", int, 1, MAX_COUNT)
    if n is not None and n != 1:
        raise _unsupported(f"only n=1 is supported: {n!r}", "n")
    best_of = _number(body, "best_of", int, 1, MAX_COUNT)
    if best_of not in (None, 1):
        raise _unsupported(f"only best_of=1 is supported: {best_of!r}", "best_of")
    for key in UNSUPPORTED_IF_SET:
        if body.get(key) not in (None, False, [], 0, ""):
            raise _unsupported(f"this worker does not support `{key}`", key)
    _valid_unicode(body)
    try:
        agent = prepare(body, kind, engine)
    except ProtocolError as e:
        raise ApiError(400, e.code, e.message, e.param) from None

    if kind == "chat":
        prompt = agent.prompt
    else:
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
            raw = raw[0]
        if isinstance(raw, str):
            text = _text(raw, "prompt")
            prompt = _tokenize(lambda: engine.text_prompt(text), "prompt")
        elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            prompt = [int(t) for t in raw]
        elif isinstance(raw, list) and len(raw) > 1 and all(isinstance(t, (str, list)) for t in raw):
            raise _unsupported("only one prompt per request is supported", "prompt")
        else:
            raise _bad("`prompt` must be a string or a list of token ids", "prompt")
    prompt_key = "messages" if kind == "chat" else "prompt"
    if not prompt:
        raise _bad("the prompt is empty", prompt_key)
    vocab = vocab_size(engine)
    low, high = min(prompt), max(prompt)
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        raise _bad(f"token id {_shown(bad)} is outside the vocabulary: ids run from 0 to {vocab - 1 if vocab else 'the vocabulary size'}", prompt_key)

    max_key = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, max_key, int, 1, MAX_COUNT)
    ctx = engine.context_length
    if ctx is not None:
        if max_tokens is not None and len(prompt) + max_tokens > ctx:
            raise ApiError(
                400, "context_length_exceeded",
                f"the prompt ({len(prompt)} tokens) plus `{max_key}` ({max_tokens}) exceeds the {_context_name(config, ctx)}: {ctx} tokens",
                max_key,
            )
        if len(prompt) >= ctx:
            raise ApiError(
                400, "context_length_exceeded",
                f"the prompt ({len(prompt)} tokens) leaves no room in the {_context_name(config, ctx)}: {ctx} tokens",
                prompt_key,
            )
    if max_tokens is None:
        max_tokens = config.default_max_tokens if ctx is None else min(config.default_max_tokens, ctx - len(prompt))

    temperature = _number(body, "temperature", float, 0, 2)
    top_p = _number(body, "top_p", float, 0, 1)
    seed = _number(body, "seed", int, 0, SEED_LIMIT - 1)
    depth_req = _number(body, "num_draft_tokens", int, 0, MAX_COUNT)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise _bad("`stop` must be a string or a list of up to 4 strings", "stop")
    stop = [_text(s, "stop") for s in stop if s]
    stream = _flag(body, "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise _bad("`stream_options` must be an object", "stream_options")
    include_usage = opts.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise _bad(f"`stream_options.include_usage` must be a boolean: {_shown(include_usage)}", "stream_options")
    ignore_eos = _flag(body, "ignore_eos")

    cls = request_class(body, class_header, config)
    class_depth = min(config.draft_depth_map.get(cls, config.draft_depth), engine.draft_depth)
    depth = class_depth if depth_req is None else min(depth_req, class_depth)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0 if temperature is None else temperature,
        top_p=1.0 if not top_p else top_p,
        seed=seed,
        depth=depth,
        stop=stop,
        ignore_eos=ignore_eos,
    )
    return ParsedRequest(kind, prompt, params, stream, bool(include_usage), agent, cls=cls)


# -- the application ---------------------------------------------------------------------

CONFIG = web.AppKey("config", WorkerConfig)
GEN = web.AppKey("generation", GenerationLoop)
METRICS = web.AppKey("metrics", Metrics)
SLOTS = web.AppKey("slots", asyncio.Semaphore)


def create_app(config: WorkerConfig) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[CONFIG] = config
    app[METRICS] = Metrics(max(config.draft_depth, *config.draft_depth_map.values(), 1) if config.draft_model else 0)
    app.cleanup_ctx.append(_generation_ctx)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/identity", identity)
    app.router.add_get("/metrics", metrics)
    return app


async def _generation_ctx(app: web.Application):
    config = app[CONFIG]
    gen = GenerationLoop(config, app[METRICS], asyncio.get_running_loop())
    app[GEN] = gen
    app[SLOTS] = asyncio.Semaphore(config.max_num_seqs)
    gen.start()
    yield
    gen.stop()


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


async def identity(request: web.Request) -> web.Response:
    try:
        gen = _loaded(request.app)
    except ApiError as e:
        return e.response()
    return web.json_response(gen.identity)


async def models(request: web.Request) -> web.Response:
    name = request.app[CONFIG].served_model_name
    return web.json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "created": int(STARTED_AT), "owned_by": "mtpstack"}]}
    )


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, "text")


async def create_response(request: web.Request) -> web.StreamResponse:
    return await _completion(request, "chat", api="responses")


async def _completion(request: web.Request, kind: str, api: str = "completions") -> web.StreamResponse:
    """Every answer carries the request's `X-Request-Id` (the proxy's, echoed), so a failure
    seen by a client can be found in both logs."""
    app = request.app
    rid = request_id(request.headers)
    try:
        gen = _loaded(app)
        try:
            body = parse_json_body(await request.read())
        except BodyError as e:
            raise _bad(str(e)) from None
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, "body_too_large", f"the request body is larger than the limit: {MAX_BODY_BYTES} bytes") from None
        original = body
        if api == "responses":
            try:
                body = responses.to_chat(body)
            except ProtocolError as e:
                raise ApiError(400, e.code, e.message, e.param) from None
        parsed = parse_request(body, kind, gen.engine, app[CONFIG], request.headers.get(CLASS_HEADER))
        if api == "responses":
            parsed.responses = responses.ResponseBuilder(parsed.agent.output, app[CONFIG].served_model_name, original)
    except ApiError as e:
        if api == "responses":
            e.param = responses.RESPONSES_PARAM.get(e.param, e.param)
        if e.status in (400, 404, 413):
            app[METRICS].rejected.labels(code=e.code).inc()
        return e.response(rid)

    slots = app[SLOTS]
    try:
        await asyncio.wait_for(slots.acquire(), timeout=app[CONFIG].admission_grace_seconds)
    except asyncio.TimeoutError:
        app[METRICS].rejected.labels(code="worker_full").inc()
        return ApiError(
            429, "worker_full",
            f"all {app[CONFIG].max_num_seqs} sequence slots are busy",
            type_="rate_limit_error",
        ).response(rid)

    try:
        seq = gen.engine.new_sequence(parsed.prompt, parsed.params)
    except Exception as e:  # nothing was submitted: give the slot back
        slots.release()
        log.exception("request %s: the sequence could not be created", rid)
        return _generation_failed(e, rid).response(rid)
    seq.hook = parsed.agent.hook if parsed.agent is not None else None
    handle = RequestHandle(seq=seq, loop=asyncio.get_running_loop(), release=slots.release, rid=rid, cls=parsed.cls)
    app[METRICS].requests_by_class.labels(parsed.cls).inc()
    seq.handle = handle
    gen.submit(handle)
    try:
        if parsed.responses is not None:
            return await _respond(request, parsed, handle)
        if parsed.stream:
            return await _stream(request, parsed, handle)
        return await _collect(request, parsed, handle)
    finally:
        if not handle.done:
            # The client went away (or writing failed): stop generating. The slot is
            # released when the generation thread drops the sequence, within one step.
            seq.cancelled = True


def _generation_failed(error, rid: str) -> ApiError:
    return ApiError(500, "generation_failed", f"generation failed for request `{rid}`: {error}")


def _usage(parsed: ParsedRequest, seq) -> dict:
    return {
        "prompt_tokens": len(parsed.prompt),
        "completion_tokens": len(seq.tokens),
        "total_tokens": len(parsed.prompt) + len(seq.tokens),
        # Extensions: how much of the output the drafter proposed and the target kept.
        "draft_tokens": seq.drafted,
        "accepted_draft_tokens": seq.accepted,
    }


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


async def _collect(request: web.Request, parsed: ParsedRequest, handle: RequestHandle) -> web.Response:
    parts, entries = [], []
    while True:
        event = await handle.events.get()
        parts.append(event.text)
        entries += event.logprobs
        if event.finish_reason is not None:
            break
    if event.error:
        return _generation_failed(event.error, handle.rid).response(handle.rid)
    text = "".join(parts)
    rid, obj, created = _ids(parsed.kind)
    name = request.app[CONFIG].served_model_name
    tokenizer = handle.seq.engine.tokenizer
    logprobs = _logprobs(parsed, entries, tokenizer)
    if parsed.kind == "chat":
        answer = render.ChatText(parsed.agent.output)
        answer.feed(text)
        answer.finish()
        choice = {"index": 0, "message": answer.message(), "logprobs": logprobs,
                  "finish_reason": answer.finish_reason(event.finish_reason)}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": event.finish_reason}
    return web.json_response(
        {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice],
         "usage": _usage(parsed, handle.seq)},
        headers={REQUEST_ID: handle.rid},
    )


async def _stream(request: web.Request, parsed: ParsedRequest, handle: RequestHandle) -> web.StreamResponse:
    rid, obj, created = _ids(parsed.kind)
    obj += ".chunk" if parsed.kind == "chat" else ""
    name = request.app[CONFIG].served_model_name
    tokenizer = handle.seq.engine.tokenizer
    resp = web.StreamResponse(
        status=HTTPStatus.OK,
        headers={hdrs.CONTENT_TYPE: "text/event-stream", hdrs.CACHE_CONTROL: "no-cache", "X-Accel-Buffering": "no",
                 REQUEST_ID: handle.rid},
    )
    await resp.prepare(request)
    answer = render.ChatText(parsed.agent.output) if parsed.kind == "chat" else None
    sent = 0  # characters of text answered so far (completions' `text_offset`)

    def chunk(delta_or_text, finish: str | None, logprobs=None) -> bytes:
        if parsed.kind == "chat":
            choice = {"index": 0, "delta": delta_or_text, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta_or_text or "", "logprobs": logprobs, "finish_reason": finish}
        payload = {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice]}
        if parsed.include_usage:
            payload["usage"] = None
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    async def write(event: Event, finish: str | None) -> None:
        nonlocal sent
        logprobs = _logprobs(parsed, event.logprobs, tokenizer, sent) if event.logprobs else None
        if answer is None:
            if event.text or logprobs or finish:
                await resp.write(chunk(event.text, finish, logprobs))
            sent += len(event.text)
            return
        deltas = answer.feed(event.text)
        if finish is not None:
            deltas += answer.finish()
        if logprobs and not deltas:
            deltas = [{}]  # logprobs of text still held back travel on their own
        for i, delta in enumerate(deltas):
            await resp.write(chunk(delta, None, logprobs if i == 0 else None))
        if finish is not None:
            await resp.write(chunk({}, answer.finish_reason(finish)))

    if answer is not None:
        await resp.write(chunk({"role": "assistant", "content": ""}, None))
    while True:
        event = await handle.events.get()
        if event.finish_reason is not None:
            break
        await write(event, None)
    if event.error:
        err = _generation_failed(event.error, handle.rid).body()
        await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
    else:
        await write(event, event.finish_reason)
        if parsed.include_usage:
            usage = {"id": rid, "object": obj, "created": created, "model": name, "choices": [],
                     "usage": _usage(parsed, handle.seq)}
            await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _respond(request: web.Request, parsed: ParsedRequest, handle: RequestHandle) -> web.StreamResponse:
    """`/v1/responses`: the same generation, answered as Responses output items or stream events."""
    builder = parsed.responses
    resp = None
    if parsed.stream:
        resp = web.StreamResponse(status=HTTPStatus.OK, headers={
            hdrs.CONTENT_TYPE: "text/event-stream", hdrs.CACHE_CONTROL: "no-cache", "X-Accel-Buffering": "no",
            REQUEST_ID: handle.rid})
        await resp.prepare(request)

    async def send(events: list[dict]) -> None:
        for e in events if resp is not None else ():
            await resp.write(f"event: {e['type']}\ndata: ".encode() + json.dumps(e).encode() + b"\n\n")

    await send(builder.start())
    while True:
        event = await handle.events.get()
        if event.finish_reason is not None:
            break
        await send(builder.feed(event.text))
    if event.error:
        err = _generation_failed(event.error, handle.rid)
        if resp is None:
            return err.response(handle.rid)
        await send([{"type": "error", "sequence_number": builder.seq + 1, "code": err.code, "message": err.message,
                     "param": None}])
    else:
        seq = handle.seq
        events = builder.feed(event.text) + builder.finish(event.finish_reason, responses.usage(len(parsed.prompt), len(seq.tokens)))
        if resp is None:
            return web.json_response(events[-1]["response"], headers={REQUEST_ID: handle.rid})
        await send(events)
    await resp.write_eof()
    return resp


# -- running ------------------------------------------------------------------------------


async def serve(config: WorkerConfig) -> int:
    """Run until SIGTERM/SIGINT. Returns the exit code: 1 when the models failed to load."""
    import signal

    app = create_app(config)
    # handler_cancellation: a closed connection cancels its handler, which cancels the sequence.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise SystemExit(f"error: cannot listen on `{config.host}:{config.port}`: {e.strerror or e}") from None
    log.info("listening on http://%s:%d (loading models)", config.host, config.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gen = app[GEN]
    code = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.2)
        except asyncio.TimeoutError:
            pass
        if gen.load_error is not None:
            from mtpstack.worker.engine import ModelNotFound

            e = gen.load_error
            msg = str(e) if isinstance(e, (ModelNotFound, ValueError, FileNotFoundError)) else f"{type(e).__name__}: {e}"
            print(f"error: the worker failed to load its models: {msg}", file=__import__("sys").stderr)
            code = 1
            break
    await runner.cleanup()
    return code
