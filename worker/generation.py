"""The generation thread and its bridge to the event loop.

One thread owns mlx: it loads the models, then repeatedly admits queued
sequences and calls `Scheduler.step()` (`mtpstack.worker.scheduler`). A handler
submits a `RequestHandle`; results cross back to it as `Event`s with
`loop.call_soon_threadsafe`, and a finished sequence's slot is released there,
before its last event is read. A sequence marked cancelled (its client went
away) is dropped before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field

from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.identity import build_identity
from mtpstack.worker.metrics import Metrics

log = logging.getLogger("mtpstack.worker")

#: Test-only hook: while the file this variable names exists, the generation loop
#: does not step (it still admits), so tests can hold sequences in flight and see
#: `/health` report a stall. Never set it in production.
STALL_FILE_ENV = "MTPSTACK_WORKER_TEST_STALL_FILE"
#: Test-only hook: seconds the generation thread waits before loading, so tests can
#: see `/health` answer 503 `loading` with models that load in milliseconds.
LOAD_DELAY_ENV = "MTPSTACK_WORKER_TEST_LOAD_DELAY"
#: How long the idle generation thread blocks on its inbox before re-checking shutdown.
IDLE_POLL = 0.05
#: When a request wakes an idle worker, the others sent with it (an agent's parallel calls, a
#: benchmark's clients) arrive a few milliseconds apart, each parsed and tokenized in turn. The
#: loop admits arrivals until the inbox has been quiet this long (never past COALESCE_MAX), so
#: they are prefilled in one forward instead of the first alone for a whole chunk.
COALESCE_QUIET = 0.01
COALESCE_MAX = 0.05


@dataclass
class Event:
    """What the generation thread hands a request: new text, and with the last one its finish reason."""

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
        disk = self.scheduler.prefix_cache.disk if self.scheduler is not None else None
        if disk is not None:
            disk.close(timeout)  # the writes queued so far, within the grace: a restart finds them

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def busy(self) -> bool:
        return self.active_count > 0 or not self.inbox.empty()

    def submit(self, handle: RequestHandle) -> None:
        self.inbox.put(handle)

    def _load(self) -> None:
        from mtpstack.worker.loading import build_engine, prepare_depth_policy

        c = self.config
        started = time.monotonic()
        self.engine, self.scheduler = build_engine(c)
        prepare_depth_policy(self.engine, c)
        self.identity = build_identity(c, self.engine, self.scheduler.prefix_cache)
        self.metrics.drafter_info(self.engine)
        # The calibrated step costs and the starting acceptance, on /metrics before the first request.
        self.metrics.draft_depth(None, 0, self.engine.depth_policy)
        log.info("loaded `%s` in %.2f s (drafter: %s, kind %s, depth %s, layers: %s)", c.model,
                 time.monotonic() - started, c.draft_model or "none", self.engine.draft_kind or "-",
                 f"auto, up to {self.engine.draft_depth}" if self.engine.depth_policy else self.engine.draft_depth, ", ".join(f"{k} x{self.engine.cache_kinds.count(k)}" for k in dict.fromkeys(self.engine.cache_kinds)))

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
                self._idle()
                continue
            if self.stall_file and os.path.exists(self.stall_file):
                time.sleep(IDLE_POLL)
                continue
            steps, seconds, prefill = sched.decode_steps, sched.decode_seconds, sched.prefill_seconds
            results = self._step()
            self.last_progress = time.monotonic()
            if sched.decode_steps > steps:
                self.metrics.target_steps.inc(sched.decode_steps - steps)
                self.metrics.target_step_seconds.inc(sched.decode_seconds - seconds)
            self.metrics.pacing(sched.pacer, sched.prefill_seconds - prefill)
            self.metrics.draft_depth(sched.batch, sched.decode_steps - steps, getattr(self.engine, "depth_policy", None))
            self.metrics.prefix_cache(sched.prefix_cache.stats, sched.prefix_cache.disk)
            for seq, result, error in results:
                if result is not None:
                    handle = getattr(seq, "handle", None)
                    self.metrics.record_step(result.drafted, result.accepted, result.tokens, getattr(handle, "cls", None),
                                             result.prefill)
                self._publish(seq, error)
            self.active_count = len(sched.active)
            self.metrics.active.set(self.active_count)

    def _step(self) -> list:
        """One scheduler step (a distributed worker first tells its other ranks what to run)."""
        return self.scheduler.step()

    def _idle(self) -> None:
        """Runs between the idle loop's polls (a distributed worker meets its other ranks here)."""

    def _admit(self, block: bool) -> None:
        """Admit what waits in the inbox; `block` (the scheduler is idle): wait for the first arrival,
        then for the others sent with it (`COALESCE_QUIET`)."""
        try:
            handle = self.inbox.get(timeout=IDLE_POLL) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        until = time.monotonic() + COALESCE_MAX
        while True:
            handle.seq.handle = handle
            self.scheduler.add(handle.seq)
            self.active_count = len(self.scheduler.active)
            self.metrics.active.set(self.active_count)
            wait = min(COALESCE_QUIET, until - time.monotonic()) if block else 0
            try:
                handle = self.inbox.get(timeout=wait) if wait > 0 else self.inbox.get_nowait()
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

