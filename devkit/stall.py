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
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


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
    """Plain streams read chunk by chunk, one after another, and `/health` asked in a loop, all
    timed, until stopped. A stream that ends is followed by the next, so a fast model cannot run
    out of tokens; the pause between two streams (a prefill) counts as no gap."""

    def __init__(self, url: str, stream_body: dict):
        self.parts = urllib.parse.urlsplit(url)
        self.body = json.dumps(stream_body).encode()
        self.streams: list[list[float]] = []  # each stream's chunk arrival times
        self.health: list[tuple[float, float]] = []  # (asked at, seconds taken)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._stream, daemon=True), threading.Thread(target=self._health, daemon=True)]

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.parts.hostname, self.parts.port, timeout=60)

    def _stream(self) -> None:
        while not self.stop.is_set():
            chunks: list[float] = []
            self.streams.append(chunks)
            conn = self._connection()
            try:
                conn.request("POST", "/v1/chat/completions", self.body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                while not self.stop.is_set():
                    line = resp.readline()
                    if not line:
                        break
                    if line.startswith(b"data: "):
                        chunks.append(time.monotonic())
            finally:
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
        gaps, chunks = [], 0
        for stream in self.streams:
            times = [t for t in stream if start <= t <= end]
            gaps += [b - a for a, b in zip(times, times[1:])]
            chunks += len(times)
        health = [took for asked, took in self.health if start <= asked <= end]
        return Stall(max(gaps, default=0.0), _median(gaps), max(health, default=0.0), _median(health), chunks,
                     len(health), end - start)


def measure(url: str, stream_body: dict, idle_seconds: float, load) -> tuple[Stall, Stall, list]:
    """(idle, loaded, the load's results): plain streams and `/health` timed for `idle_seconds`,
    then while `load()` runs (it returns when its requests are answered). Give the stream a long
    `max_tokens` with `ignore_eos`: a gap is only seen within one stream."""
    probe = _Probe(url, stream_body)
    for t in probe.threads:
        t.start()
    try:
        while not (probe.streams and probe.streams[0]):
            time.sleep(0.01)  # the first stream's first chunk: its prefill is part of neither phase
        start = time.monotonic()
        time.sleep(idle_seconds)
        loaded_at = time.monotonic()
        results = load()
        done = time.monotonic()
    finally:
        probe.stop.set()
        for t in probe.threads:
            t.join(10)
    return probe.phase(start, loaded_at), probe.phase(loaded_at, done), results


def plain_stream(max_tokens: int) -> dict:
    """A chat request streaming `max_tokens` tokens whatever the model says, no thinking, no schema."""
    return {"messages": [{"role": "user", "content": "Count"}], "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            **NO_THINK}


def fuel_schema(i: int) -> dict:
    """700 integer ranges that llguidance's lexer works on for ~0.1 s (2 shared cores) before its
    fuel runs out, a 400; distinct per `i`, so none comes from the worker's cache of grammars."""
    return {"anyOf": [{"type": "integer", "minimum": -j * (123_457 + i) - 17, "maximum": j * (987_654 + i) + 523}
                      for j in range(700)]}


def send_schemas(url: str, indices, width: int, timeout: float = 60.0) -> list[int]:
    """A chat request with `fuel_schema(i)` as its response format for each `i`, `width` at a time; their statuses."""
    def send(i: int) -> int:
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **NO_THINK,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": fuel_schema(i)}}}
        conn = http.client.HTTPConnection(urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port, timeout=timeout)
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    with ThreadPoolExecutor(width) as pool:
        return list(pool.map(send, indices))
