"""The grammars waiting for a compile thread: fair across clients, bounded, deadlines that count compiling only.

Why it exists: with one first-come-first-served pool, 120 hostile schemas sent at once (each worked on
until llguidance's fuel ran out) made a tiny schema sent half a second later wait seconds for a thread,
and the 5 s compile deadline, which counted that wait, then refused it with a 400 as if its schema were
at fault. Here:

- **Fair**: each client has its own line, and the threads take the clients' lines in turn (round
  robin); a client with nothing waiting goes before the clients that have had a turn and wait for
  another (fq_codel's new flows before old ones), so a client's first grammar starts as soon as a
  thread is free, after only the first grammars of other such newcomers, however many a flooding
  client has sent. Within a line the smallest grammar goes first (its size, as text,
  stands for its cost): a client's own tiny schema does not wait behind its own 40 KB ones. A client is what the caller names; the worker names the connection's
  peer address (`mtpstack.worker.handlers`). Not the connection itself: HTTP/1.1 carries one request at
  a time per connection, so per-connection turns would be first come first served again, and a flood
  over 120 connections would take 120 turns. Not an API key: workers never see one (the proxy keeps
  them, and admits at most a worker's batch width to it at once, so behind the proxy this queue holds
  at most that many).
- **Bounded**: at most `per_client` grammars of one client wait, `max_waiting` of all clients; past
  either bound a grammar is refused at once, `Busy` with status 429 (the client's own line is full) or
  503 (the worker's is). A client's full line keeps its smallest grammars: a newcomer smaller than
  the largest one waiting takes that one's place, which is refused (429) instead.
- **Deadlines**: a grammar that has not started compiling within `start_seconds` of its arrival leaves
  the line, `Busy` 503: the worker was busy, nothing is wrong with the schema. Once started, it has
  `run_seconds` of compiling (`TimeoutError` past that: that one is the grammar's).
- **Shared**: a grammar (by its key) already waiting or compiling is not queued twice; every request
  for it waits for the one job. Looking grammars up in a cache is the caller's job, before it comes
  here: a compiled grammar never waits behind uncompiled ones.

The event loop only appends and removes under a lock held for a few list operations; the threads
compile and report back with `call_soon_threadsafe`. Pure threading and asyncio, no llguidance.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable


class Busy(Exception):
    """A grammar refused for the worker's load, not for itself: `status` 429 or 503, and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _line_full(waiting: int) -> Busy:
    return Busy(429, f"the worker is busy compiling grammars: {waiting} from this client are waiting already, the "
                     "most one client may have waiting; retry shortly")


class _Job:
    """One grammar to build: the key it is known by, what builds it, the client whose line it is in,
    and two futures on the requesting loop: started, done (with the result or the build's exception)."""

    __slots__ = ("key", "build", "client", "loop", "order", "started", "done", "started_at", "callers", "taken")

    def __init__(self, key: str, build: Callable[[], Any], client: str, loop: asyncio.AbstractEventLoop, order: tuple):
        self.key, self.build, self.client, self.loop = key, build, client, loop
        self.order = order  # (size, arrival): a line is kept in this order
        self.started: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[Any] = loop.create_future()
        self.started_at = 0.0
        self.callers = 0
        self.taken = False  # a thread has it (under the lock)


def _resolve(fut: asyncio.Future, value: Any = None, error: BaseException | None = None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


class _Lines:
    """The shared state the threads read: each client's waiting jobs, and whose turn is next.
    Kept apart from `CompileQueue` so the threads do not keep the queue alive: they end once it is
    collected (`weakref.finalize`)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.lines: dict[str, list[_Job]] = {}  # each in `_Job.order`: smallest first
        #: Clients with a job waiting, next turn first: those that have not had a turn since their
        #: line was last empty (`fresh`) go before those that have.
        self.fresh: deque[str] = deque()
        self.turns: deque[str] = deque()
        self.jobs: dict[str, _Job] = {}  # by key: every job waiting or compiling
        self.waiting = 0
        self.closed = False

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def next_job(self) -> _Job | None:
        with self.cond:
            while not self.fresh and not self.turns and not self.closed:
                self.cond.wait()
            if self.closed:
                return None
            client = (self.fresh or self.turns).popleft()
            line = self.lines[client]
            job = line.pop(0)
            if line:
                self.turns.append(client)  # its next grammar waits for the others' turns
            else:
                del self.lines[client]
            self.waiting -= 1
            job.taken = True
            return job

    def finished(self, job: _Job) -> None:
        with self.cond:
            if self.jobs.get(job.key) is job:
                del self.jobs[job.key]


def _serve(lines: _Lines, initializer: Callable[[], None] | None) -> None:
    if initializer is not None:
        initializer()
    while (job := lines.next_job()) is not None:
        job.started_at = time.monotonic()
        _notify(job, job.started)
        try:
            result, error = job.build(), None
        except BaseException as e:  # handed to the requests waiting for it
            result, error = None, e
        lines.finished(job)
        _notify(job, job.done, result, error)
        del job, result, error


def _notify(job: _Job, fut: asyncio.Future, value: Any = None, error: BaseException | None = None) -> None:
    try:
        job.loop.call_soon_threadsafe(_resolve, fut, value, error)
    except RuntimeError:
        pass  # the loop is closed: nobody waits any more


class CompileQueue:
    """`threads` threads building grammars, taken in turn across clients. `run` is the one entry."""

    def __init__(self, threads: int, *, per_client: int, max_waiting: int, start_seconds: float,
                 initializer: Callable[[], None] | None = None, name: str = "grammar"):
        self.per_client, self.max_waiting, self.start_seconds = per_client, max_waiting, start_seconds
        self._lines = _Lines()
        self._arrivals = 0
        self._threads = [threading.Thread(target=_serve, args=(self._lines, initializer), name=f"{name}_{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()
        weakref.finalize(self, self._lines.close)

    @property
    def waiting(self) -> int:
        """Grammars waiting for a thread (not those compiling)."""
        return self._lines.waiting

    def _join(self, key: str, build: Callable[[], Any], client: str) -> _Job:
        lines = self._lines
        with lines.cond:
            loop = asyncio.get_running_loop()
            job = lines.jobs.get(key)
            if job is not None and job.loop is loop:
                return job  # the same grammar waits or compiles already: one job for both
            self._arrivals += 1
            order = (len(key), self._arrivals)
            line = lines.lines.get(client)
            if line is not None and len(line) >= self.per_client:
                if line[-1].order <= order:
                    raise _line_full(len(line))
                self._displace(line[-1])  # the largest waiting makes room for a smaller one
            elif lines.waiting >= self.max_waiting:
                raise Busy(503, f"the worker is busy compiling grammars: {lines.waiting} are waiting, the most it "
                                "keeps waiting; retry shortly")
            job = _Job(key, build, client, loop, order)
            lines.jobs[key] = job
            line = lines.lines.get(client)
            if line is None:
                line = lines.lines[client] = []
                lines.fresh.append(client)
            bisect.insort(line, job, key=lambda j: j.order)
            lines.waiting += 1
            lines.cond.notify()
            return job

    def _displace(self, job: _Job) -> None:
        """Under the lock: `job` leaves its full line for a smaller one; its requests are refused."""
        self._remove(job)
        _notify(job, job.started, error=_line_full(self.per_client))

    def _remove(self, job: _Job) -> None:
        lines = self._lines
        line = lines.lines[job.client]
        line.remove(job)
        lines.waiting -= 1
        if not line:
            del lines.lines[job.client]
            (lines.fresh if job.client in lines.fresh else lines.turns).remove(job.client)
        if lines.jobs.get(job.key) is job:
            del lines.jobs[job.key]

    def _leave(self, job: _Job) -> None:
        """The last request waiting for `job` gave up: out of the line, unless a thread has it."""
        lines = self._lines
        with lines.cond:
            if job.taken or job.callers:
                return
            line = lines.lines.get(job.client)
            if line is not None and job in line:
                self._remove(job)

    async def run(self, key: str, build: Callable[[], Any], client: str, run_seconds: float) -> Any:
        """What `build()` returns (or raises), built on a thread once it is `client`'s turn. `Busy`
        when the lines are full or it cannot start within `start_seconds`; `TimeoutError` when it
        started but did not finish within `run_seconds` (it runs on; a later request shares it)."""
        job = self._join(key, build, client)
        job.callers += 1
        try:
            if not job.started.done():
                await asyncio.wait([job.started], timeout=self.start_seconds)
                if not job.started.done():
                    raise Busy(503, f"the worker is busy compiling other requests' grammars: this one could not "
                                    f"start within {self.start_seconds:g} s; retry shortly")
            job.started.result()  # `Busy` when a smaller grammar of its client took its place
            left = job.started_at + run_seconds - time.monotonic()
            if not job.done.done():
                await asyncio.wait([job.done], timeout=max(left, 0.0))
                if not job.done.done():
                    raise TimeoutError
            return job.done.result()
        finally:
            job.callers -= 1
            if not job.callers:
                self._leave(job)
