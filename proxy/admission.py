"""Admission: one gate per worker, one FIFO queue per served model.

Pure asyncio, no HTTP: `ModelAdmission.acquire()` hands out a worker slot or raises
`Rejected`; `release()` gives the slot back, straight to the oldest waiter. A request may name
a preferred worker (`acquire(prefer=...)`, where its prompt's prefix is cached): it gets that
worker when it has a free slot, else any free one, exactly as without a preference.

Guarantees, for one event loop:
- a worker never holds more admitted requests than its gate (`inflight <= gate`);
- strict FIFO: a freed slot goes to the longest-waiting request, and a new request never
  overtakes one already waiting, even when a slot happens to be free at that instant; a request
  sent back by a worker that never took it (`acquire(retry=True)`) arrived before every request
  now waiting, so it goes ahead of them, and a full queue does not refuse it;
- every `acquire()` ends in exactly one of: a slot, `Rejected`, or the caller's cancellation
  (a slot granted to a request cancelled at that moment is passed on, never lost);
- a preference never makes a request wait (`prefer_wait_seconds` 0, the default): it waits only
  when every healthy worker of the model is full, and a preference only chooses among the
  workers with a free slot. With `prefer_wait_seconds` > 0 (`proxy.affinityWaitSeconds`), a
  request whose preferred worker is healthy but full waits up to that long for a slot there (its
  prefix is cached there; elsewhere it is prefilled again), then takes any free worker. While it
  holds out for its worker it does not hold up the requests behind it: they take the other
  workers' free slots, and it still comes first for its own worker's next slot.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Callable, Protocol

#: Weight of the newest service time in the moving average that sets Retry-After: recent
#: enough to follow a change of prompt sizes, smooth enough that one outlier does not swing it.
SERVICE_EWMA_WEIGHT = 0.2


class Rejected(Exception):
    """A request the proxy answers itself: status, OpenAI error code, message, Retry-After."""

    def __init__(self, status: HTTPStatus, code: str, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


@dataclass(eq=False)
class Upstream:
    """One configured worker as the proxy sees it."""

    name: str
    model: str
    url: str
    gate: int
    #: The `model` to send upstream (mlx_lm.server expects the path it loaded), or None to
    #: forward the client's body untouched.
    rewrite_model: str | None = None
    order: int = 0
    inflight: int = 0
    healthy: bool = False
    #: Free-form reason of the last health change, for logs and /readyz.
    health_detail: str = "not checked yet"
    #: Its prefix cache's id (`/identity`'s `prefix_cache.id`): set, what the cache holds outlives the
    #: process (a disk tier), so an outage or a restart that keeps the id keeps its conversations'
    #: affinities; None: its cache dies with the process.
    cache_id: str | None = None

    @property
    def free(self) -> int:
        return self.gate - self.inflight


class AdmissionObserver(Protocol):
    def inflight_changed(self, upstream: Upstream) -> None: ...
    def queue_changed(self, model: str, depth: int) -> None: ...


@dataclass(eq=False)
class ModelAdmission:
    """The workers of one served model, their gates and the model's waiting line."""

    model: str
    upstreams: list[Upstream]
    max_waiting: int
    timeout_seconds: float
    #: Seconds a client should wait before retrying when no worker is healthy.
    unhealthy_retry_after: int = 1
    observer: AdmissionObserver | None = None
    clock: Callable[[], float] = time.monotonic
    #: Seconds a request waits for its preferred worker's slot while another worker has one free.
    prefer_wait_seconds: float = 0.0
    #: Each waiter with the worker it prefers (or None), the slots it needs (its `n`), whether it
    #: still holds out for that worker (until `prefer_wait_seconds` have passed), and its place in
    #: line (`_tag`): the line is kept in that order, which is the order slots are handed out in.
    _waiters: deque[tuple[asyncio.Future[Upstream], Upstream | None, int, bool, float]] = field(default_factory=deque)
    _service_seconds: float | None = None
    #: Fair queueing (start-time fair queueing over tenants): the place in line of the waiter served
    #: last, and each tenant's last place handed out, which its next waiter's follows by 1 / weight.
    _virtual: float = 0.0
    _last_tag: dict[str, float] = field(default_factory=dict)

    # -- state -------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def healthy(self) -> bool:
        return any(u.healthy for u in self.upstreams)

    def retry_after(self) -> int:
        """Whole seconds until a slot is likely free: the observed service time times the
        requests ahead, spread over the healthy workers' gates; at least 1."""
        if self._service_seconds is None:
            return 1
        capacity = sum(u.gate for u in self.upstreams if u.healthy) or sum(u.gate for u in self.upstreams)
        return max(1, math.ceil(self._service_seconds * (len(self._waiters) + 1) / capacity))

    @property
    def widest(self) -> int:
        """The most slots one request may take: the widest gate among this model's workers."""
        return max(u.gate for u in self.upstreams)

    def _pick(self, prefer: Upstream | None = None, weight: int = 1) -> Upstream | None:
        """`prefer` when it is healthy with `weight` free slots; else the least-loaded healthy worker
        with that many (by share of its gate in use, then by count, then config order), or None."""
        if prefer is not None and prefer.healthy and prefer.free >= weight:
            return prefer
        best: Upstream | None = None
        for u in self.upstreams:
            if not u.healthy or u.free < weight:
                continue
            if best is None or (u.inflight * best.gate, u.inflight) < (best.inflight * u.gate, best.inflight):
                best = u
        return best

    # -- admission ---------------------------------------------------------------------
    async def acquire(self, prefer: Upstream | None = None, weight: int = 1, retry: bool = False,
                      tenant: str = "", share: int = 1) -> Upstream:
        """`weight` slots on one worker of this model (a request's `n` choices are rows of one
        batch), on `prefer` when it has them free; waits in line when no gate has: first come first
        served within a `tenant`, and tenants' turns round-robin by their `share` (a tenant of share
        2 gets two slots for another's one; one tenant alone: plain first come first served). `weight`
        must not exceed `widest`. `retry`: the request was admitted before and its worker never took
        it; it goes ahead of everyone waiting."""
        if not self.healthy:
            raise Rejected(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "no_healthy_worker",
                f"no healthy worker serves model `{self.model}` right now",
                self.unhealthy_retry_after,
            )
        hold = self._holds_out(prefer, weight) and not retry
        # Those holding out for their own (full) workers want no free slot, so they do not keep a
        # newcomer from one, nor count against it when the queue is full of them.
        if (not self._waiters or retry or all(w[3] for w in self._waiters)) and not hold:
            upstream = self._pick(prefer, weight)
            if upstream is not None:
                self._take(upstream, weight)
                return upstream
        if len(self._waiters) >= self.max_waiting and not retry:
            raise Rejected(
                HTTPStatus.TOO_MANY_REQUESTS,
                "queue_full",
                f"every worker of model `{self.model}` is busy and its queue is full: {self.max_waiting} waiting",
                self.retry_after(),
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Upstream] = loop.create_future()
        if retry:
            self._waiters.appendleft((fut, prefer, weight, False, -math.inf))
        else:
            self._enqueue((fut, prefer, weight, hold, self._tag(tenant, share)))
        self._queue_changed()
        timer = loop.call_later(self.timeout_seconds, self._expire, fut)
        # Never so long that the queue's timeout refuses it while another worker is free.
        lapse = loop.call_later(min(self.prefer_wait_seconds, self.timeout_seconds / 2), self._lapse, fut) if hold else None
        if self.prefer_wait_seconds > 0:  # those ahead may be holding out for their own workers
            self._dispatch()
        try:
            return await fut
        except asyncio.CancelledError:
            # The caller went away. A slot granted in the same loop turn is handed on.
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result(), weight=weight)
            else:
                fut.cancel()
                self._forget(fut)
            raise
        finally:
            timer.cancel()
            if lapse is not None:
                lapse.cancel()

    def _tag(self, tenant: str, share: int) -> float:
        """A new waiter's place in line: one turn of its tenant's (1 / share) after the later of the
        tenant's last place and the place now being served, so a tenant with many waiting delays
        another's newcomer by one turn, not by all of them."""
        last = self._last_tag
        tag = max(self._virtual, last.get(tenant, self._virtual)) + 1.0 / share
        last[tenant] = tag
        if len(last) > 4 * len(self._waiters) + 64:  # places already passed say nothing: bounded by those waiting
            for name in [n for n, t in last.items() if t <= self._virtual]:
                del last[name]
        return tag

    def _enqueue(self, waiter: tuple) -> None:
        """Into the line by place (`_tag`), after every waiter with the same place or an earlier one."""
        tag = waiter[4]
        i = len(self._waiters)
        while i > 0 and self._waiters[i - 1][4] > tag:
            i -= 1
        self._waiters.insert(i, waiter)

    def _holds_out(self, prefer: Upstream | None, weight: int) -> bool:
        """Whether a request preferring `prefer` waits for it rather than take another worker now:
        waiting is on, and `prefer` is healthy, full, and wide enough for it."""
        return (self.prefer_wait_seconds > 0 and prefer is not None and prefer.healthy
                and prefer.free < weight <= prefer.gate)

    def _lapse(self, fut: asyncio.Future[Upstream]) -> None:
        """`fut`'s wait for its preferred worker is over: from now on any free worker will do."""
        for i, (waiter, prefer, weight, _, tag) in enumerate(self._waiters):
            if waiter is fut:
                self._waiters[i] = (waiter, prefer, weight, False, tag)
                self._dispatch()
                return

    def _expire(self, fut: asyncio.Future[Upstream]) -> None:
        if fut.done():
            return
        self._forget(fut)
        fut.set_exception(
            Rejected(
                HTTPStatus.TOO_MANY_REQUESTS,
                "queue_timeout",
                f"no worker of model `{self.model}` had a free slot within {self.timeout_seconds:g} s",
                self.retry_after(),
            )
        )

    def _forget(self, fut: asyncio.Future[Upstream]) -> None:
        for i, w in enumerate(self._waiters):
            if w[0] is fut:
                del self._waiters[i]
                self._queue_changed()
                return

    def _take(self, upstream: Upstream, weight: int = 1) -> None:
        upstream.inflight += weight
        assert upstream.inflight <= upstream.gate, "admitted beyond the gate"
        if self.observer:
            self.observer.inflight_changed(upstream)

    def release(self, upstream: Upstream, service_seconds: float | None = None, weight: int = 1) -> None:
        """Give `weight` slots back; the oldest waiter gets them at once when they are enough."""
        upstream.inflight -= weight
        assert upstream.inflight >= 0, "released a slot twice"
        if service_seconds is not None:
            prev = self._service_seconds
            self._service_seconds = (
                service_seconds if prev is None else prev + SERVICE_EWMA_WEIGHT * (service_seconds - prev)
            )
        if self.observer:
            self.observer.inflight_changed(upstream)
        self._dispatch()

    def _dispatch(self) -> None:
        changed = False
        i = 0
        while i < len(self._waiters):
            fut, prefer, weight, holding, tag = self._waiters[i]
            if fut.done():
                del self._waiters[i]
                changed = True
                continue
            if holding and prefer is not None and prefer.healthy:
                # Holding out for its own worker: that worker's slot, else let the next ones through.
                if prefer.free < weight:
                    i += 1
                    continue
                upstream: Upstream | None = prefer
            else:
                upstream = self._pick(prefer, weight)
                if upstream is None:
                    break
            del self._waiters[i]
            changed = True
            self._take(upstream, weight)
            self._virtual = max(self._virtual, tag)
            fut.set_result(upstream)
        if changed:
            self._queue_changed()

    def _queue_changed(self) -> None:
        if self.observer:
            self.observer.queue_changed(self.model, len(self._waiters))

    # -- health ------------------------------------------------------------------------
    def set_healthy(self, upstream: Upstream, healthy: bool, detail: str) -> bool:
        """Record a health result; returns True when the state changed. Losing the last
        healthy worker answers everyone waiting with 503 rather than letting them time out."""
        upstream.health_detail = detail
        if upstream.healthy == healthy:
            return False
        upstream.healthy = healthy
        if healthy:
            self._dispatch()
        elif not self.healthy:
            while self._waiters:
                fut = self._waiters.popleft()[0]
                if not fut.done():
                    fut.set_exception(
                        Rejected(
                            HTTPStatus.SERVICE_UNAVAILABLE,
                            "no_healthy_worker",
                            f"no healthy worker serves model `{self.model}` right now",
                            self.unhealthy_retry_after,
                        )
                    )
            self._queue_changed()
        return True
