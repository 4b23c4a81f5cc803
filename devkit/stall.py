"""Whether a server's event loop is held: a plain stream's largest gap between chunks and `/health`'s
slowest answer, measured while nothing else runs (idle) and while a batch of other requests is
answered (hostile schemas, say), and a flood of hostile schemas with probes sent during it (`flood`).
Used by `tests/worker/test_hostile_agent.py`, `tests/worker/test_grammar_flood.py` and
`bench/scripts/load_bench.py hostile`. Threads and blocking sockets, so the measuring client never
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


def schema_request(schema: dict, max_tokens: int = 2) -> dict:
    """A chat request whose `response_format` is `schema`, no thinking."""
    return {"messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens, **NO_THINK,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


#: A schema an application sends: compiles in a millisecond.
BENIGN_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@dataclass
class Answer:
    status: int | None  # None: no answer (the connection failed or timed out)
    seconds: float
    headers: dict
    body: bytes
    ended: float = 0.0  # `time.monotonic()` when it was answered

    def error(self) -> dict:
        """The `error` object of a refusal (empty when the body is not one)."""
        try:
            return json.loads(self.body).get("error") or {}
        except (ValueError, AttributeError):
            return {}


def post(url: str, body: dict | bytes, *, source: str | None = None, timeout: float = 60.0,
         path: str = "/v1/chat/completions") -> Answer:
    """One JSON request on a fresh connection, timed; from the local address `source` when given (a
    second loopback address, 127.0.0.2, is another client to a server that tells clients apart by
    address)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    started = time.monotonic()
    try:
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        ended = time.monotonic()
        return Answer(resp.status, ended - started, dict(resp.getheaders()), data, ended)
    except OSError:
        ended = time.monotonic()
        return Answer(None, ended - started, {}, b"", ended)
    finally:
        conn.close()


def send_schemas(url: str, indices, width: int, timeout: float = 60.0) -> list[int]:
    """A chat request with `fuel_schema(i)` as its response format for each `i`, `width` at a time; their statuses."""
    with ThreadPoolExecutor(width) as pool:
        return [a.status for a in pool.map(lambda i: post(url, schema_request(fuel_schema(i)), timeout=timeout), indices)]


@dataclass
class Flood:
    """What a flood of hostile schemas got, and what the probes sent during it got."""

    hostile: list[Answer]
    probes: dict[str, Answer]

    @property
    def statuses(self) -> dict[int | None, int]:
        """The hostile requests' statuses, counted (None: no answer)."""
        counts: dict[int | None, int] = {}
        for a in self.hostile:
            counts[a.status] = counts.get(a.status, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))

    @property
    def last_hostile_answer(self) -> float:
        return max(a.ended for a in self.hostile)


def flood_bodies(indices) -> list[dict]:
    """A chat request with `fuel_schema(i)` as its response format, for each `i`: distinct, none cached."""
    return [schema_request(fuel_schema(i)) for i in indices]


def flood(url: str, bodies: list[dict], probes: dict[str, tuple[float, dict, str | None]], timeout: float = 60.0,
          path: str = "/v1/chat/completions") -> Flood:
    """Every body sent to `path` at once (a thread and a connection each), and each probe `name ->
    (delay, chat request, source address)` sent `delay` seconds after the flood began."""
    # Encoded first: encoding 120 bodies of 45 KB in the measuring process would hold its GIL and
    # count against the server being measured.
    data = [json.dumps(b).encode() for b in bodies]
    with ThreadPoolExecutor(len(data) + len(probes)) as pool:
        started = time.monotonic()
        hostile = [pool.submit(post, url, body, timeout=timeout, path=path) for body in data]

        def probe(delay: float, body: dict, source: str | None) -> Answer:
            time.sleep(max(0.0, started + delay - time.monotonic()))
            return post(url, body, source=source, timeout=timeout)

        sent = {name: pool.submit(probe, *spec) for name, spec in probes.items()}
        return Flood([f.result() for f in hostile], {name: f.result() for name, f in sent.items()})
