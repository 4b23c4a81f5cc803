"""The compile queue's scheduling, with real threads and builds that wait for the test's say-so:
turns across clients, smallest first within a client, the bounds and their answers, deadlines that
count compiling only, one job per grammar."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mtpstack.worker.protocol.compile_queue import Busy, CompileQueue


class Builds:
    """Builds that record the order they started in and block until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def __call__(self, name: str):
        gate = self.gates.setdefault(name, threading.Event())

        def build():
            with self.lock:
                self.started.append(name)
            if not gate.wait(30):
                raise AssertionError(f"{name} was never released")
            return f"built {name}"

        return build

    def release(self, *names: str) -> None:
        for n in names:
            self.gates.setdefault(n, threading.Event()).set()

    def release_all(self) -> None:
        for gate in self.gates.values():
            gate.set()


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def queue(threads: int = 1, per_client: int = 8, max_waiting: int = 32, start_seconds: float = 30.0) -> CompileQueue:
    return CompileQueue(threads, per_client=per_client, max_waiting=max_waiting, start_seconds=start_seconds)


def submit(q: CompileQueue, builds: Builds, key: str, client: str, run_seconds: float = 30.0) -> asyncio.Task:
    return asyncio.ensure_future(q.run(key, builds(key), client, run_seconds))


async def test_a_client_that_sent_one_grammar_goes_before_the_rest_of_a_flood_of_another():
    q, builds = queue(threads=1), Builds()
    flood = [submit(q, builds, f"a{i}", "flooder") for i in range(6)]
    await until(lambda: builds.started == ["a0"], "the flood's first build")
    late = submit(q, builds, "b0", "other")
    await until(lambda: q.waiting == 6, "the late one in line")
    builds.release("a0")
    await until(lambda: len(builds.started) == 2, "the next build")
    assert builds.started == ["a0", "b0"]  # its turn came before the flood's second
    builds.release_all()
    assert await late == "built b0"
    assert await asyncio.gather(*flood) == [f"built a{i}" for i in range(6)]


async def test_within_a_client_the_smallest_grammar_goes_first():
    q, builds = queue(threads=1), Builds()
    first = submit(q, builds, "x" * 10, "c")
    await until(lambda: builds.started, "the first build")
    big = submit(q, builds, "y" * 5000, "c")
    small = submit(q, builds, "z" * 20, "c")
    await until(lambda: q.waiting == 2, "both in line")
    builds.release_all()
    await asyncio.gather(first, big, small)
    assert [len(k) for k in builds.started] == [10, 20, 5000]


async def test_a_client_past_its_share_is_refused_with_429_and_a_smaller_grammar_takes_the_largest_ones_place():
    q, builds = queue(threads=1, per_client=2), Builds()
    running = submit(q, builds, "r" * 50, "c")
    await until(lambda: builds.started, "the first build")
    waiting = [submit(q, builds, f"{i}" * 100, "c") for i in range(2)]
    await until(lambda: q.waiting == 2, "its line full")
    with pytest.raises(Busy) as refused:
        await q.run("w" * 100, builds("w" * 100), "c", 30)  # as large as the largest waiting: refused
    assert refused.value.status == 429 and "from this client are waiting" in refused.value.message
    small = submit(q, builds, "s", "c")
    with pytest.raises(Busy) as displaced:
        await waiting[1]  # the largest (and latest) of the two waiting made room
    assert displaced.value.status == 429
    assert q.waiting == 2
    builds.release_all()
    assert await small == "built s"
    await asyncio.gather(running, waiting[0])
    assert "1" * 100 not in builds.started


async def test_a_full_queue_refuses_the_next_client_with_503():
    q, builds = queue(threads=1, max_waiting=3), Builds()
    running = submit(q, builds, "r", "a")
    await until(lambda: builds.started, "the first build")
    waiting = [submit(q, builds, f"k{i}", f"client{i}") for i in range(3)]
    await until(lambda: q.waiting == 3, "the queue full")
    with pytest.raises(Busy) as refused:
        await q.run("new", builds("new"), "client9", 30)
    assert refused.value.status == 503 and "3 are waiting" in refused.value.message
    builds.release_all()
    await asyncio.gather(running, *waiting)


async def test_a_grammar_that_cannot_start_in_time_is_refused_as_busy_and_is_never_built():
    q, builds = queue(threads=1, start_seconds=0.2), Builds()
    running = submit(q, builds, "slow", "a")
    await until(lambda: builds.started, "the first build")
    with pytest.raises(Busy) as refused:
        await q.run("late", builds("late"), "b", 30)
    assert refused.value.status == 503 and "could not start within 0.2 s" in refused.value.message
    assert q.waiting == 0  # it left the line
    builds.release_all()
    await running
    await asyncio.sleep(0.05)
    assert builds.started == ["slow"]


async def test_the_compile_deadline_counts_from_the_start_not_from_the_arrival():
    q, builds = queue(threads=1), Builds()
    running = submit(q, builds, "first", "a")
    await until(lambda: builds.started, "the first build")
    queued = submit(q, builds, "second", "b", run_seconds=0.3)
    await asyncio.sleep(0.5)  # longer in line than its whole compile deadline
    builds.release("first", "second")
    assert await queued == "built second"
    await running
    stuck = submit(q, builds, "stuck", "c", run_seconds=0.2)
    with pytest.raises(TimeoutError):
        await stuck  # started, and still compiling past its deadline
    builds.release("stuck")


async def test_one_grammar_asked_for_by_many_requests_is_built_once():
    q, builds = queue(threads=2), Builds()
    same = [submit(q, builds, "shared", f"c{i}") for i in range(5)]
    await until(lambda: builds.started, "the build")
    builds.release_all()
    assert await asyncio.gather(*same) == ["built shared"] * 5
    assert builds.started == ["shared"]


async def test_a_request_that_leaves_takes_its_waiting_grammar_out_of_the_line():
    q, builds = queue(threads=1), Builds()
    running = submit(q, builds, "first", "a")
    await until(lambda: builds.started, "the first build")
    gone = submit(q, builds, "gone", "b")
    await until(lambda: q.waiting == 1, "it in line")
    gone.cancel()
    await until(lambda: q.waiting == 0, "the line emptied")
    builds.release_all()
    await running
    await asyncio.sleep(0.05)
    assert builds.started == ["first"]


async def test_a_build_that_raises_hands_its_error_to_every_request_waiting_for_it():
    q = queue(threads=1)

    def build():
        raise ValueError("not a grammar")

    results = await asyncio.gather(*(q.run("bad", build, f"c{i}", 30) for i in range(3)), return_exceptions=True)
    assert [str(r) for r in results] == ["not a grammar"] * 3
