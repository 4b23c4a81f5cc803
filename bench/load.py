"""The whole stack under load (`bench/scripts/load_bench.py`'s modes): processes started and their logs read, what
each request's client saw, counted over many, gauges sampled, slots settled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from mtpstack.bench.stats import percentile
from mtpstack.proxy.prometheus import parse_samples, sample
from mtpstack.runtime import Process, StartError, free_port, url_of

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[1]  # the checkout, where `python -m devkit...` runs


# -- processes and their logs --------------------------------------------------------------------
async def ready(proc: Process, path: str, timeout: float = 60.0) -> Process:
    """`proc` once `path` answers; a start that fails ends the run with its error."""
    try:
        await asyncio.to_thread(proc.wait_ready, path, timeout)
    except StartError as e:
        raise SystemExit(f"error: {e}") from None
    return proc


async def fake_process(procs, workdir: Path, name: str, model: str, gate: int, *args: str):
    """A healthy `devkit.fake_fleet.FakeUpstream` serving `model` at `gate` (`args`: its pacing)."""
    from devkit.fake_fleet import FakeUpstream

    fake = FakeUpstream(name, model, gate, workdir / f"{name}.log", procs, args)
    await ready(fake.start(), "/health")
    return fake


async def proxy_process(procs, workdir: Path, name: str, proxy: dict, workers: dict, python: str = sys.executable,
                        extra: tuple[str, ...] = ()) -> Process:
    """`mtpstack proxy` (run by `python`) on a free port, ready; its config and log `workdir/NAME.json`, `.log`."""
    port = free_port()
    path = workdir / f"{name}.json"
    path.write_text(json.dumps({"proxy": {**proxy, "port": port}, "workers": workers}))
    proc = procs.start([python, "-m", "mtpstack", "proxy", "--config", str(path), *extra],
                       log_path=workdir / f"{name}.log", name=name, url=url_of(HOST, port), cwd=ROOT)
    return await ready(proc, "/readyz")


def log_events(log: Path) -> tuple[list[str], list[dict]]:
    """A log's lines and the JSON objects among them; none without the log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return [], []
    events = []
    for line in lines:
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return lines, [e for e in events if isinstance(e, dict)]


def request_events(log: Path) -> list[dict]:
    return [e for e in log_events(log)[1] if e.get("event") == "request"]


def memory_kib(pid: int) -> dict:
    """VmRSS and VmHWM (peak RSS) of a process, in KiB, from /proc/PID/status."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


# -- one request, and many ----------------------------------------------------------------------
@dataclass
class Answer:
    """What a client saw: a status (None: no answer, `reason` says why), an error code, how a 200 stream ended
    (`done`, `error`, `cut`) and the time it took."""

    status: int | None = None
    code: str | None = None
    stream: str | None = None
    retry_after: str | None = None
    reason: str | None = None
    seconds: float = 0.0

    def outcome(self) -> str:
        """"ok" (a 200, a stream to its `[DONE]`), or what the client saw instead."""
        if self.status is None:
            return self.reason
        if self.status != 200:
            return f"{self.status} {self.code}" if self.code else f"{self.status}"
        if self.stream in (None, "done"):
            return "ok"
        return f"stream {self.code}" if self.code else "stream cut without an error event"


def _code(raw: bytes) -> str | None:
    try:
        return json.loads(raw)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


async def send(session: aiohttp.ClientSession, url: str, body: dict, bound: float, rid: str | None = None) -> Answer:
    """One request (chat completions for a body with `messages`, else completions); none after `bound` s."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    a = Answer()
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(bound):
            async with session.post(url + path, json=body, headers={"X-Request-Id": rid} if rid else None) as r:
                if r.status == 200 and body.get("stream"):
                    a.stream = "cut"
                    async for line in r.content:
                        if line.startswith(b"data: [DONE]"):
                            a.stream = "done"
                        elif line.startswith(b'data: {"error"') and a.stream == "cut":
                            a.stream, a.code = "error", _code(line[6:])
                else:
                    raw = await r.read()
                    if r.status != 200:
                        a.code, a.retry_after = _code(raw), r.headers.get("Retry-After")
                a.status = r.status
    except TimeoutError:
        a.reason = f"no answer within {bound:g} s"
    except aiohttp.ClientError as e:
        a.reason = type(e).__name__
    a.seconds = time.monotonic() - t0
    return a


@dataclass
class Tally:
    """Answers counted: by status, a refusal by `status code`, 429s by Retry-After, the unanswered by why, streams
    by how they ended."""

    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    codes: Counter = field(default_factory=Counter)
    retry_after: Counter = field(default_factory=Counter)
    unanswered_reasons: Counter = field(default_factory=Counter)
    streams: Counter = field(default_factory=Counter)
    latencies: list = field(default_factory=list)

    @property
    def unanswered(self) -> int:
        return sum(self.unanswered_reasons.values())

    def add(self, a: Answer) -> None:
        self.sent += 1
        self.streams["started"] += bool(a.stream)
        if a.status is None:
            self.unanswered_reasons[a.reason] += 1
            return
        self.statuses[str(a.status)] += 1
        self.latencies.append(a.seconds)
        if a.stream:
            self.streams[a.stream] += 1
        elif a.status != 200:
            self.codes[f"{a.status} {a.code or '?'}"] += 1
            if a.status == 429:
                self.retry_after[a.retry_after] += 1

    def counts(self) -> dict:
        return {"sent": self.sent, "statuses": dict(self.statuses), "error_codes": dict(self.codes),
                "streams_done": self.streams["done"], "unanswered": self.unanswered}

    def figures(self, seconds: float) -> dict:
        ms = lambda q: round(percentile(self.latencies, q) * 1000, 1) if self.latencies else None  # noqa: E731
        return {
            **self.counts(), "answered": self.sent - self.unanswered,
            "unanswered_reasons": dict(self.unanswered_reasons),
            "retry_after_missing": self.retry_after[None],
            "retry_after_values": {k: n for k, n in self.retry_after.items() if k is not None},
            "streams": self.streams["started"], "stream_errors": self.streams["error"],
            "stream_truncated": self.streams["cut"],
            "seconds": round(seconds, 2), "requests_per_second": round(self.sent / seconds, 1) if seconds else None,
            "latency_ms": {"p50": ms(50), "p99": ms(99), "max": ms(100)},
        }


def until(n: int, deadline: float, start: int = 0):
    for i in range(start, n):
        if time.monotonic() > deadline:
            return
        yield i


async def drive(session, url: str, n: int, clients: int, make_body, tally: Tally, bound: float, deadline: float,
                start: int = 0) -> bool:
    """`clients` loops sending requests `start`..`n - 1` one after another; False when the deadline cut it short."""
    counter, before = until(n, deadline, start), tally.sent

    async def client() -> None:
        for i in counter:
            tally.add(await send(session, url, make_body(i), bound))

    await asyncio.gather(*(client() for _ in range(clients)))
    return tally.sent - before == n - start


async def serves_again(session, url: str, bodies: list[dict], bound: float, tally: Tally | None = None) -> dict:
    """The `bodies` sent at once (counted in `tally`, when given): do the slots serve after a fault?"""
    tally = Tally() if tally is None else tally
    for a in await asyncio.gather(*(send(session, url, b, bound) for b in bodies)):
        tally.add(a)
    return tally.counts()


# -- what the processes report ---------------------------------------------------------------
async def get_metrics(session: aiohttp.ClientSession, url: str) -> dict:
    return await get_json(session, url + "/metrics", parse_samples)


async def get_json(session: aiohttp.ClientSession, url: str, parse=json.loads) -> dict:
    """`url`'s answer, parsed (JSON, or by `parse`); {} when it does not answer or does not parse."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return parse(await r.text()) or {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}


@contextlib.asynccontextmanager
async def sampled(session, targets: dict[str, tuple[str, str, dict]], interval: float = 0.1):
    """Polls /metrics meanwhile, keeping each target's (key -> base url, metric, labels) largest value: a sample,
    not a trace, so a peak shorter than the interval can be missed."""
    found: dict = {"sampled_max": dict.fromkeys(targets), "samples": 0}
    peaks = found["sampled_max"]

    async def run() -> None:
        while True:
            for url in sorted({u for u, _, _ in targets.values()}):
                m = await get_metrics(session, url)
                for key, (u, name, labels) in targets.items():
                    if u == url and (v := sample(m, name, **labels)) is not None:
                        peaks[key] = max(peaks[key] or 0.0, v)
            found["samples"] += 1
            await asyncio.sleep(interval)

    task = asyncio.create_task(run())
    try:
        yield found
    finally:
        task.cancel()


async def settle(check, timeout: float, interval: float = 0.1) -> tuple[bool, object]:
    """Poll `check()` -> (ok, value) until ok or `timeout`; returns the last (ok, value)."""
    deadline = time.monotonic() + timeout
    while True:
        ok, value = await check()
        if ok or time.monotonic() > deadline:
            return ok, value
        await asyncio.sleep(interval)


def proxy_slots(session, proxy_url: str, worker: str | None = None):
    """A settle check: the proxy's inflight (one worker, or all) and queue depth are 0."""

    async def check():
        m = await get_metrics(session, proxy_url)
        if not m:
            return False, None
        inflight = m.get("mtpstack_proxy_inflight", {})
        busy = inflight.get((("worker", worker),), 0) if worker is not None else sum(inflight.values())
        waiting = sum(m.get("mtpstack_proxy_queue_depth", {}).values())
        return busy == 0 and waiting == 0, {"inflight": busy, "queue_depth": waiting}

    return check
