"""An idle worker admits requests sent together in one go, so their prompts share one prefill forward."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import mtpstack.worker.generation as generation
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.generation import GenerationLoop, RequestHandle
from mtpstack.worker.metrics import Metrics


class Recorder:
    def __init__(self):
        self.active = []

    def add(self, seq):
        self.active.append(seq)


def loop_with_recorder() -> GenerationLoop:
    gen = GenerationLoop(WorkerConfig(model="m"), Metrics(3), asyncio.new_event_loop())
    gen.scheduler = Recorder()
    return gen


def handle(gen) -> RequestHandle:
    return RequestHandle(seq=SimpleNamespace(handle=None), loop=gen.loop, release=lambda: None)


def test_an_idle_worker_admits_a_request_arriving_just_after_the_first_in_the_same_go(monkeypatch):
    # A generous quiet window, so the test does not depend on how fast threads are scheduled.
    monkeypatch.setattr(generation, "COALESCE_QUIET", 2.0)
    monkeypatch.setattr(generation, "COALESCE_MAX", 5.0)
    gen = loop_with_recorder()
    first, second = handle(gen), handle(gen)
    gen.submit(first)
    threading.Timer(0.05, gen.submit, [second]).start()
    gen._admit(block=True)
    assert gen.scheduler.active == [first.seq, second.seq]


def test_a_busy_worker_does_not_wait_for_more_arrivals(monkeypatch):
    monkeypatch.setattr(generation, "COALESCE_QUIET", 2.0)
    monkeypatch.setattr(generation, "COALESCE_MAX", 5.0)
    gen = loop_with_recorder()
    gen.submit(handle(gen))
    start = time.monotonic()
    gen._admit(block=False)
    assert len(gen.scheduler.active) == 1 and time.monotonic() - start < 1.0  # no quiet window when busy


def test_the_wait_never_passes_its_cap(monkeypatch):
    monkeypatch.setattr(generation, "COALESCE_QUIET", 0.2)
    monkeypatch.setattr(generation, "COALESCE_MAX", 0.3)
    gen = loop_with_recorder()
    stop = threading.Event()

    def trickle():  # a request every 0.1 s, each within the quiet window of the last
        while not stop.wait(0.1):
            gen.submit(handle(gen))

    gen.submit(handle(gen))
    threading.Thread(target=trickle, daemon=True).start()
    start = time.monotonic()
    gen._admit(block=True)
    stop.set()
    assert time.monotonic() - start < 0.3 + 0.2 + 0.5  # the cap, one last quiet window, scheduling slack
