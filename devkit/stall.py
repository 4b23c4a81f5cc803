"""Whether a server's event loop is held: a plain stream's largest gap between chunks and `/health`'s
slowest answer, measured while nothing else runs (idle) and while a batch of other requests is
answered (hostile schemas, say). Used by `tests/worker/test_hostile_agent.py` and
`bench/scripts/hostile_bench.py`. Threads and blocking sockets, so the measuring client never
shares a loop with what it measures.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

#: How often `/health` is asked: often enough to see a stall of a tenth of a second.
HEALTH_EVERY = 0.02


@dataclass
class Stall:
    """Worst and typical figures of one phase, in seconds."""

    stream_gap_max: float
    stream_gap_median: float
    health_max: float
    health_median: float
    chunks: int
    health_probes: int
    seconds: float


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


class _Probe:
    """A plain stream read chunk by chunk and `/health` asked in a loop, both timed, until stopped."""

    def __init__(self, url: str, stream_body: dict):
        self.parts = urllib.parse.urlsplit(url)
        self.body = json.dumps(stream_body).encode()
        self.chunks: list[float] = []  # arrival times
        self.health: list[tuple[float, float]] = []  # (asked at, seconds taken)
        self.stop = threading.Event()
        self.ended = threading.Event()
        self.threads = [threading.Thread(target=self._stream, daemon=True), threading.Thread(target=self._health, daemon=True)]

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.parts.hostname, self.parts.port, timeout=60)

    def _stream(self) -> None:
        conn = self._connection()
        try:
            conn.request("POST", "/v1/chat/completions", self.body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            while not self.stop.is_set():
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    self.chunks.append(time.monotonic())
        finally:
            self.ended.set()
            conn.close()

    def _health(self) -> None:
        conn = self._connection()
        try:
            while not self.stop.is_set():
                asked = time.monotonic()
                conn.request("GET", "/health")
                conn.getresponse().read()
                self.health.append((asked, time.monotonic() - asked))
                time.sleep(HEALTH_EVERY)
        finally:
            conn.close()

    def phase(self, start: float, end: float) -> Stall:
        times = [t for t in self.chunks if start <= t <= end]
        gaps = [b - a for a, b in zip(times, times[1:])]
        health = [took for asked, took in self.health if start <= asked <= end]
        return Stall(max(gaps, default=0.0), _median(gaps), max(health, default=0.0), _median(health), len(times),
                     len(health), end - start)


def measure(url: str, stream_body: dict, idle_seconds: float, load) -> tuple[Stall, Stall, list]:
    """(idle, loaded, the load's results): a plain stream and `/health` timed for `idle_seconds`,
    then while `load()` runs (it returns when its requests are answered). The stream must outlast
    both: a long `max_tokens` with `ignore_eos`."""
    probe = _Probe(url, stream_body)
    for t in probe.threads:
        t.start()
    try:
        while not probe.chunks and not probe.ended.is_set():
            time.sleep(0.01)  # the stream's first chunk: prefill is not part of either phase
        start = time.monotonic()
        time.sleep(idle_seconds)
        loaded_at = time.monotonic()
        results = load()
        done = time.monotonic()
        if probe.ended.is_set() and probe.chunks and probe.chunks[-1] < done:
            raise RuntimeError("the plain stream ended before the load did: raise its `max_tokens`")
    finally:
        probe.stop.set()
        for t in probe.threads:
            t.join(10)
    return probe.phase(start, loaded_at), probe.phase(loaded_at, done), results


def concurrently(send, bodies: list, width: int) -> list:
    """`send(body)` for each body, `width` at a time; their results in order."""
    with ThreadPoolExecutor(width) as pool:
        return list(pool.map(send, bodies))
