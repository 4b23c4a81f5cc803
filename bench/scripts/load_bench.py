"""Load and fault figures for the whole stack: the gates hold under load, and faults leave no
hung client and no leaked slot.

    .venv/bin/python bench/scripts/load_bench.py [--quick] [--out load-bench.json] [--skip-real]

Phases, in one run, every process started here on loopback and stopped at exit (Ctrl-C too):

1. Load through fake upstreams (`devkit.fake_upstream`, which count their own concurrency and
   refuse above their gate): N requests (default 20,000) from 64 concurrent clients through the
   proxy (`python -m mtpstack proxy`, its own process) with gates of 2 and of 4, two upstreams
   each, a quarter of the requests streamed. `queue.maxWaiting` leaves room for every client,
   so any 429 is a fault. A shorter variant per gate with a small `maxWaiting` shows the 429
   `queue_full` (with Retry-After) that the queue bound must produce.
2. Load through real workers: `mtpstack up` (a subprocess) with one native worker serving tiny
   random-weight models (`devkit.demo.tiny.build_tiny_pair`), width 2 coupled with gate 2; a few
   hundred requests from 16 clients. The worker's `rejected_total{code="worker_full"}` must not
   move; the proxy's inflight and the worker's active sequences are sampled.
3. Worker kills mid-stream: fake upstreams SIGKILLed while they stream (two requests admitted,
   one queued) and restarted; a few kills of the real worker, which `mtpstack up` restarts.
   A client whose stream neither ends nor errors within a bound is hung; a proxy slot still
   taken once things settle is leaked. Failover: one of a model's two upstreams killed while
   each streams; the survivor's stream must finish and new requests must be answered by it.
4. Client disconnects (streams after their first chunks, streams and plain requests 20-80 ms
   after sending; by FIN or RST): hung clients, leaked proxy slots, requests still held by the
   upstream (fake `active`, the real worker's `active_sequences`), the status the proxy logged for
   each (found by its X-Request-Id; must be 499), then a normal request per model to show the
   slots serve again.

Raw figures go to the JSON file, the table to stdout, progress to stderr. The script exits 1
when a check fails (the figures are still written).
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from mtpstack.worker.proof import free_port

ROOT = _checkout.ROOT
HOST = "127.0.0.1"
#: Fake upstream pacing under load: short enough that the proxy is the bottleneck, long enough
#: that requests overlap inside an upstream (an instant plain answer never yields).
LOAD_DELAY, LOAD_CHUNKS, LOAD_INTERVAL = 0.001, 8, 0.001
#: A stream long enough to be cut in the middle: 2,000 chunks 5 ms apart (10 s).
LONG_STREAM = {"chunks": 2000, "interval": 0.005}
#: A client waiting longer than this for its next step (first chunk, end, error) is hung.
HANG_SECONDS = 20.0
#: Time for slots and gauges to come back to 0 after a fault before it counts as a leak.
SETTLE_SECONDS = 10.0
STREAM_EVERY = 4  # every 4th load request is streamed


# -- child processes ------------------------------------------------------------------------
class Children:
    """Every process this script started, so all of them die at exit, also on Ctrl-C."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.extra_pids: list[int] = []

    def start(self, argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        p = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "ab"),
            start_new_session=True, env=env,
        )
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen, timeout: float = 10.0) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                _killpg(p.pid)
                p.wait(5)

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            try:
                self.stop(p, timeout=15)
            except Exception:  # noqa: BLE001 - at exit, keep killing the rest
                _killpg(p.pid)
        for pid in self.extra_pids:
            kill_if_ours(pid)


def _killpg(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_if_ours(pid: int) -> None:
    """SIGKILL a process `mtpstack up` started for us, if it still runs (a pid can be reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return
    if b"mtpstack" in cmdline:
        _killpg(pid)


CHILDREN = Children()


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


def say(text: str) -> None:
    print(f"load-bench: {text}", file=sys.stderr, flush=True)


# -- Prometheus text --------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_metrics(text: str) -> dict[str, dict[tuple, float]]:
    """{name: {((label, value), ...): sample}} from Prometheus text."""
    out: dict[str, dict[tuple, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
            out.setdefault(m.group(1), {})[labels] = float(m.group(3))
    return out


def sample(metrics: dict, name: str, **labels: str) -> float | None:
    return metrics.get(name, {}).get(tuple(sorted(labels.items())))


async def get_metrics(session: aiohttp.ClientSession, url: str) -> dict:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return parse_metrics(await r.text())
    except (aiohttp.ClientError, TimeoutError):
        return {}


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return 0, {}


class GaugeSampler:
    """Polls /metrics of some processes on an interval, keeping the largest value of each series
    asked for. A sample, not a trace: a peak shorter than the interval can be missed."""

    def __init__(self, session: aiohttp.ClientSession, targets: dict[str, tuple[str, str, dict]], interval: float = 0.1):
        #: key -> (base url, metric name, labels of the one series wanted)
        self.session, self.targets, self.interval = session, targets, interval
        self.max: dict[str, float] = {}
        self.samples = 0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        urls = sorted({u for u, _, _ in self.targets.values()})
        while True:
            for url in urls:
                m = await get_metrics(self.session, url)
                for key, (u, name, labels) in self.targets.items():
                    v = sample(m, name, **labels) if u == url else None
                    if v is not None:
                        self.max[key] = max(self.max.get(key, 0.0), v)
            self.samples += 1
            await asyncio.sleep(self.interval)

    def __enter__(self) -> GaugeSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()


# -- processes of the fake setups -------------------------------------------------------------
@dataclass
class Fake:
    name: str
    model: str
    port: int
    gate: int
    log: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        argv = [sys.executable, "-m", "devkit.fake_upstream", "--host", HOST, "--port", str(self.port), "--gate", str(self.gate),
                "--name", self.name, "--delay", str(LOAD_DELAY), "--chunks", str(LOAD_CHUNKS), "--interval", str(LOAD_INTERVAL)]
        self.proc = CHILDREN.start(argv, self.log)


@dataclass
class ProxyProc:
    port: int
    config_path: Path
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        self.proc = CHILDREN.start([sys.executable, "-m", "mtpstack", "proxy", "--config", str(self.config_path)], self.log)


def fake_fleet(fakes: list[Fake], proxy_port: int, max_waiting: int, queue_timeout: float = 60.0) -> dict:
    gates = {}
    for f in fakes:
        gates[f.model] = f.gate
    return {
        "proxy": {
            "host": HOST, "port": proxy_port, "modelConcurrencyLimits": gates,
            "queue": {"maxWaiting": max_waiting, "timeoutSeconds": queue_timeout},
            "timeouts": {"connectSeconds": 5, "firstByteSeconds": 60, "idleSeconds": 30},
            "shutdownGraceSeconds": 2,
        },
        "workers": {
            f.name: {"model": f.model, "target": {"path": "fake/upstream", "bits": 4}, "maxNumSeqs": f.gate, "host": HOST, "port": f.port}
            for f in fakes
        },
    }


async def wait_status(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen | None, timeout: float, what: str, proc_name: str | None = None
) -> None:
    """Poll `url` until 200; fails when `proc` (named `proc_name`, default `what`) exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc_name or what} exited with code {proc.returncode} while waiting for {what}")
        if (await get_json(session, url))[0] == 200:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{what} not ready within {timeout:g} s: {url}")


class FakeSetup:
    """Fake upstreams plus a proxy process in front of them, from one config."""

    def __init__(self, workdir: Path, label: str, fakes: list[tuple[str, str, int]], max_waiting: int):
        self.dir = workdir / label
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fakes = [Fake(name, model, free_port(), gate, self.dir / f"{name}.log") for name, model, gate in fakes]
        self.proxy = ProxyProc(free_port(), self.dir / "fleet.yaml", self.dir / "proxy.log")
        self.proxy.config_path.write_text(yaml.safe_dump(fake_fleet(self.fakes, self.proxy.port, max_waiting)))

    async def start(self, session: aiohttp.ClientSession) -> None:
        for f in self.fakes:
            f.start()
        for f in self.fakes:
            await wait_status(session, f.url + "/health", f.proc, 60, f"fake upstream `{f.name}`")
        self.proxy.start()
        await wait_status(session, self.proxy.url + "/readyz", self.proxy.proc, 60, "the proxy")

    def stop(self) -> None:
        for p in [self.proxy.proc, *(f.proc for f in self.fakes)]:
            if p is not None:
                CHILDREN.stop(p)

    async def stats(self, session: aiohttp.ClientSession) -> dict[str, dict]:
        return {f.name: (await get_json(session, f.url + "/stats"))[1] for f in self.fakes}


# -- load -------------------------------------------------------------------------------------
@dataclass
class LoadTally:
    sent: int = 0
    unanswered: int = 0
    unanswered_reasons: dict = field(default_factory=dict)
    statuses: dict = field(default_factory=dict)
    #: "status code" of each non-200 answer -> count
    codes: dict = field(default_factory=dict)
    retry_after_missing: int = 0
    #: Retry-After value -> count
    retry_after: dict = field(default_factory=dict)
    streams: int = 0
    streams_done: int = 0
    stream_errors: int = 0
    stream_truncated: int = 0
    latencies: list = field(default_factory=list)


def _count(d: dict, key) -> None:
    d[key] = d.get(key, 0) + 1


async def one_request(session: aiohttp.ClientSession, url: str, body: dict, tally: LoadTally, bound: float) -> None:
    """Send one request and classify its answer; an answer that does not come within `bound` is unanswered."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    stream = bool(body.get("stream"))
    tally.sent += 1
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(bound):
            async with session.post(url + path, json=body) as r:
                status = r.status
                if status == 200 and stream:
                    tally.streams += 1
                    done = errored = False
                    async for line in r.content:
                        if line.startswith(b"data: [DONE]"):
                            done = True
                        elif line.startswith(b'data: {"error"'):
                            errored = True
                    if done:
                        tally.streams_done += 1
                    elif errored:
                        tally.stream_errors += 1
                    else:
                        tally.stream_truncated += 1
                else:
                    raw = await r.read()
                    if status != 200:
                        try:
                            code = json.loads(raw)["error"]["code"]
                        except (ValueError, KeyError, TypeError):
                            code = "?"
                        _count(tally.codes, f"{status} {code}")
                        if status == 429:
                            if "Retry-After" in r.headers:
                                _count(tally.retry_after, r.headers["Retry-After"])
                            else:
                                tally.retry_after_missing += 1
    except TimeoutError:
        tally.unanswered += 1
        _count(tally.unanswered_reasons, f"no answer within {bound:g} s")
        return
    except aiohttp.ClientError as e:
        tally.unanswered += 1
        _count(tally.unanswered_reasons, type(e).__name__)
        return
    _count(tally.statuses, str(status))
    tally.latencies.append(time.monotonic() - t0)


async def drive(session, url: str, n: int, clients: int, make_body, tally: LoadTally, bound: float, deadline: float, start: int = 0) -> bool:
    """`clients` loops sending requests `start`..`n - 1` one after another; False when the deadline cut it short."""
    counter = iter(range(start, n))
    cut = False

    async def client() -> None:
        nonlocal cut
        for i in counter:
            if time.monotonic() > deadline:
                cut = True
                return
            await one_request(session, url, make_body(i), tally, bound)

    await asyncio.gather(*(client() for _ in range(clients)))
    return not cut


def fake_body(model: str):
    def make(i: int) -> dict:
        stream = i % STREAM_EVERY == STREAM_EVERY - 1
        if (i // STREAM_EVERY) % 2:
            return {"model": model, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 8, "stream": stream}
        return {"model": model, "prompt": f"hello {i}", "max_tokens": 8, "stream": stream}

    return make


def tally_dict(t: LoadTally, seconds: float) -> dict:
    lat = sorted(t.latencies)
    pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 1) if lat else None  # noqa: E731
    return {
        "sent": t.sent, "answered": t.sent - t.unanswered, "unanswered": t.unanswered, "unanswered_reasons": t.unanswered_reasons,
        "statuses": t.statuses, "error_codes": t.codes, "retry_after_missing": t.retry_after_missing, "retry_after_values": t.retry_after,
        "streams": t.streams, "streams_done": t.streams_done, "stream_errors": t.stream_errors, "stream_truncated": t.stream_truncated,
        "seconds": round(seconds, 2), "requests_per_second": round(t.sent / seconds, 1) if seconds else None,
        "latency_ms": {"p50": pick(0.5), "p99": pick(0.99), "max": round(lat[-1] * 1000, 1) if lat else None},
    }


async def fake_load(session, workdir: Path, *, gate: int, requests: int, clients: int, max_waiting: int, deadline: float) -> dict:
    label = f"fake-gate{gate}-waiting{max_waiting}"
    say(f"{label}: {requests} requests from {clients} clients, 2 upstreams of gate {gate}")
    setup = FakeSetup(workdir, label, [(f"u{i}", "fake", gate) for i in range(2)], max_waiting)
    try:
        await setup.start(session)
        pid = setup.proxy.proc.pid
        before = memory_kib(pid)
        tally = LoadTally()
        targets = {f"inflight{{worker={f.name}}}": (setup.proxy.url, "mtpstack_proxy_inflight", {"worker": f.name}) for f in setup.fakes}
        targets["queue_depth{model=fake}"] = (setup.proxy.url, "mtpstack_proxy_queue_depth", {"model": "fake"})
        t0 = time.monotonic()
        with GaugeSampler(session, targets, interval=0.1) as sampler:
            # in two halves, to tell a one-time growth of the proxy's memory from a steady one
            half = requests // 2
            complete = await drive(session, setup.proxy.url, half, clients, fake_body("fake"), tally, 90.0, deadline)
            middle = memory_kib(pid)
            complete &= await drive(session, setup.proxy.url, requests, clients, fake_body("fake"), tally, 90.0, deadline, start=half)
        seconds = time.monotonic() - t0
        await asyncio.sleep(1.0)
        after = memory_kib(pid)
        stats = await setup.stats(session)
        m = await get_metrics(session, setup.proxy.url)
        result = {
            "label": label, "target": "fake", "gate": gate, "upstreams": len(setup.fakes), "clients": clients,
            "max_waiting": max_waiting, "capacity": gate * len(setup.fakes) + max_waiting,
            "queue_bound_reachable": clients > gate * len(setup.fakes) + max_waiting,
            "requested": requests, "complete": complete, **tally_dict(tally, seconds),
            "upstream_max_concurrency": {k: v.get("max_active") for k, v in stats.items()},
            "upstream_violations": sum(v.get("violations", 0) for v in stats.values()),
            "upstream_served": {k: v.get("served") for k, v in stats.items()},
            "sampled_max": {k: sampler.max.get(k) for k in targets}, "samples": sampler.samples,
            "inflight_after": sum((m.get("mtpstack_proxy_inflight") or {}).values()),
            "proxy_rss_kib": {"before": before.get("VmRSS"), "half": middle.get("VmRSS"), "after": after.get("VmRSS"), "peak": after.get("VmHWM")},
        }
        say(f"{label}: {result['statuses']} in {seconds:.1f} s, upstream max concurrency {result['upstream_max_concurrency']}")
        return result
    finally:
        setup.stop()


# -- streaming clients for faults --------------------------------------------------------------
@dataclass
class RawStream:
    """One streamed request over a raw socket, so closing it is exactly a FIN or an RST."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int | None = None
    buffer: bytes = b""
    events: int = 0

    @classmethod
    async def open(cls, port: int, body: dict, request_id: str | None = None) -> RawStream:
        reader, writer = await asyncio.open_connection(HOST, port)
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        data = json.dumps(body).encode()
        rid = f"X-Request-Id: {request_id}\r\n" if request_id else ""
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n{rid}"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data
        )
        await writer.drain()
        return cls(reader, writer)

    async def headers(self) -> int:
        head = await self.reader.readuntil(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])
        return self.status

    async def until_events(self, n: int) -> bool:
        """Read until `n` SSE events arrived; False at end of stream first."""
        while self.events < n:
            chunk = await self.reader.read(65536)
            if not chunk:
                return False
            self.buffer = (self.buffer + chunk)[-4096:]
            self.events += chunk.count(b"data: ")
        return True

    async def outcome(self) -> str:
        """Read to the end: `done` ([DONE] seen), `error_event`, `cut` (ended with neither), or `status_N`."""
        if self.status is None:
            await self.headers()
        rest = await self.reader.read()
        tail = self.buffer + rest
        if self.status != 200:
            return f"status_{self.status}"
        if b"data: [DONE]" in tail:
            return "done"
        if b'data: {"error"' in tail:
            return "error_event"
        return "cut"

    def close(self, how: str = "fin") -> None:
        if how == "rst":
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                import struct

                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.close()


async def settle(session, check, timeout: float = SETTLE_SECONDS) -> tuple[bool, object]:
    """Poll `check()` -> (ok, value) until ok or `timeout`; returns the last (ok, value)."""
    deadline = time.monotonic() + timeout
    while True:
        ok, value = await check()
        if ok or time.monotonic() > deadline:
            return ok, value
        await asyncio.sleep(0.1)


def proxy_slots(session, proxy_url: str, worker: str | None = None):
    """A settle check: the proxy's inflight (one worker, or all) and queue depth are 0."""

    async def check():
        m = await get_metrics(session, proxy_url)
        if not m:
            return False, None
        inflight = m.get("mtpstack_proxy_inflight", {})
        if worker is not None:
            busy = inflight.get((("worker", worker),), 0)
        else:
            busy = sum(inflight.values())
        waiting = sum(m.get("mtpstack_proxy_queue_depth", {}).values())
        return busy == 0 and waiting == 0, {"inflight": busy, "queue_depth": waiting}

    return check


async def kill_round(session, proxy_url: str, proxy_port: int, body: dict, kill, worker: str) -> dict:
    """Two streams admitted and one queued; once both admitted streams have a chunk, `kill()`.
    Each client must then see its stream end (or an error status) within HANG_SECONDS."""
    streams = []
    try:
        for _ in range(3):
            streams.append(await RawStream.open(proxy_port, body))
            await asyncio.sleep(0.02)  # arrival order: the third one queues behind the gate

        async def first_chunk(s: RawStream) -> bool:
            return await s.headers() == 200 and await s.until_events(1)

        started = [asyncio.ensure_future(first_chunk(s)) for s in streams]
        deadline = time.monotonic() + HANG_SECONDS
        while sum(t.done() and not t.exception() and t.result() for t in started) < 2 and time.monotonic() < deadline:
            await asyncio.wait(started, timeout=0.05)
        admitted = sum(t.done() and not t.exception() and t.result() for t in started)
        kill()
        outcomes = []
        for s, t in zip(streams, started):
            try:
                async with asyncio.timeout(HANG_SECONDS):
                    await asyncio.wait([t])  # its first chunk, its error status, or its end
                    outcomes.append(await s.outcome())
            except TimeoutError:
                outcomes.append("hung")
            except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
                outcomes.append("connection_closed")
        for t in started:
            t.cancel()
    finally:
        for s in streams:
            s.close()
    ok, value = await settle(session, proxy_slots(session, proxy_url, worker))
    return {"admitted_before_kill": admitted, "outcomes": outcomes, "slot_leaked": not ok, "after": value}


def summarize_rounds(rounds: list[dict]) -> dict:
    outcomes: dict = {}
    for r in rounds:
        for o in r["outcomes"]:
            _count(outcomes, o)
    return {
        "kills": len(rounds),
        "clients": sum(len(r["outcomes"]) for r in rounds),
        "hung": outcomes.get("hung", 0),
        "rounds_with_leaked_slot": sum(r["slot_leaked"] for r in rounds),
        "admitted_streams_cut_without_error_event": outcomes.get("cut", 0),
        "outcomes": outcomes,
        "kills_with_fewer_than_2_streams_started": sum(r["admitted_before_kill"] < 2 for r in rounds),
    }


async def fake_kills(session, workdir: Path, kills: int, deadline: float) -> dict:
    """SIGKILL fake upstreams mid-stream, round robin over 4 models of one upstream each, and restart them."""
    setup = FakeSetup(workdir, "fake-kills", [(f"k{i}", f"m{i}", 2) for i in range(4)], max_waiting=8)
    say(f"fake kills: {kills} SIGKILLs mid-stream over {len(setup.fakes)} upstreams")
    rounds: list[dict] = []
    try:
        await setup.start(session)
        for i in range(kills):
            if time.monotonic() > deadline:
                break
            f = setup.fakes[i % len(setup.fakes)]
            await _await_healthy(session, setup.proxy.url, f, deadline)
            body = {"model": f.model, "prompt": "long", "stream": True, "x_fake": LONG_STREAM}

            def kill(f=f):
                _killpg(f.proc.pid)
                f.proc.wait(5)
                f.restarts += 1
                f.start()  # back in the background; the proxy's health check picks it up

            r = await kill_round(session, setup.proxy.url, setup.proxy.port, body, kill, f.name)
            rounds.append(r)
            if (i + 1) % 20 == 0:
                say(f"fake kills: {i + 1} done")
        ok, value = await settle(session, proxy_slots(session, setup.proxy.url))
        result = {"target": "fake", "requested": kills, **summarize_rounds(rounds), "slots_after": value, "leaked_after": not ok}
        say(f"fake kills: {result['outcomes']}, leaked after: {value}")
        return result
    finally:
        setup.stop()


async def fake_failover(session, workdir: Path, n: int, deadline: float) -> dict:
    """A model served by two upstreams: one stream on each, SIGKILL the first upstream mid-stream.
    The stream on the other must finish, and once the dead one's stream has its error event (the
    proxy has then marked it unhealthy), new requests must be answered by the survivor."""
    setup = FakeSetup(workdir, "fake-failover", [("f0", "mm", 2), ("f1", "mm", 2)], max_waiting=8)
    say(f"fake failover: {n} SIGKILLs of one of two upstreams of a model")
    rounds: list[dict] = []
    after = LoadTally()
    try:
        await setup.start(session)
        victim = setup.fakes[0]
        for i in range(n):
            if time.monotonic() > deadline:
                break
            for f in setup.fakes:
                await _await_healthy(session, setup.proxy.url, f, deadline)
            # both idle: the first stream goes to f0 (config order), the second to f1 (least loaded)
            body = {"model": "mm", "prompt": "long", "stream": True, "x_fake": {"chunks": 200, "interval": 0.005}}

            def kill():
                _killpg(victim.proc.pid)
                victim.proc.wait(5)
                victim.restarts += 1
                victim.start()

            streams = []
            outcomes = []
            try:
                for _ in range(2):
                    streams.append(await RawStream.open(setup.proxy.port, body))
                    await asyncio.sleep(0.02)
                for st in streams:
                    try:
                        async with asyncio.timeout(HANG_SECONDS):
                            await st.headers()
                            await st.until_events(1)
                    except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
                        pass
                kill()
                for st in streams:
                    try:
                        async with asyncio.timeout(HANG_SECONDS):
                            outcomes.append(await st.outcome())
                    except TimeoutError:
                        outcomes.append("hung")
                    except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
                        outcomes.append("connection_closed")
            finally:
                for st in streams:
                    st.close()
            # the error event came after the proxy marked the dead upstream unhealthy
            await asyncio.gather(*(one_request(session, setup.proxy.url, {"model": "mm", "prompt": "x"}, after, HANG_SECONDS) for _ in range(4)))
            ok, value = await settle(session, proxy_slots(session, setup.proxy.url))
            rounds.append({"admitted_before_kill": 2, "outcomes": outcomes, "slot_leaked": not ok, "after": value})
        ok, value = await settle(session, proxy_slots(session, setup.proxy.url))
        s = summarize_rounds(rounds)
        result = {
            "target": "fake", "requested": n, **s, "slots_after": value, "leaked_after": not ok,
            "survivor_streams_done": s["outcomes"].get("done", 0),
            "requests_after_failure": {"sent": after.sent, "statuses": after.statuses, "unanswered": after.unanswered, "error_codes": after.codes},
        }
        say(f"fake failover: {result['outcomes']}, requests after: {after.statuses}")
        return result
    finally:
        setup.stop()


async def _await_healthy(session, proxy_url: str, f: Fake, deadline: float) -> None:
    end = min(deadline, time.monotonic() + 60)
    while time.monotonic() < end:
        if f.proc.poll() is not None:  # the restart lost a race for the port: try again
            f.start()
        status, body = await get_json(session, proxy_url + "/readyz")
        if body.get("workers", {}).get(f.name, {}).get("healthy"):
            return
        await asyncio.sleep(0.05)


async def disconnects(session, proxy_url: str, proxy_port: int, models: list[str], n: int, clients: int, body_for, deadline: float) -> dict:
    """`n` requests closed early from `clients` concurrent loops, half by FIN, half by RST: 6 in 8
    streams after 1-3 chunks (`mid-stream`), 1 in 8 streams 20-80 ms after sending without reading
    (`early`: queued, or just admitted), 1 in 8 non-streamed requests 20-80 ms after sending
    (`plain`: queued, or the worker still computing the answer)."""
    rng = random.Random(7)
    kinds: dict = {}
    ids: dict[str, str] = {}  # X-Request-Id -> how the client left, to find each one in the proxy's log
    hung = errors = 0
    counter = iter(range(n))

    async def loop():
        nonlocal hung, errors
        for i in counter:
            if time.monotonic() > deadline:
                return
            model = models[i % len(models)]
            how = "rst" if (i // 8) % 2 else "fin"
            early = {3: "early", 7: "plain"}.get(i % 8)
            s = None
            rid = f"load-bench-{os.getpid()}-{i}"
            try:
                async with asyncio.timeout(HANG_SECONDS):
                    s = await RawStream.open(proxy_port, body_for(model, early != "plain"), rid)
                    if early:
                        await asyncio.sleep(rng.uniform(0.02, 0.08))
                        kind = f"{early}/{how}"
                    else:
                        status = await s.headers()
                        if status != 200:
                            kind = f"status_{status}"
                        elif await s.until_events(rng.randint(1, 3)):
                            kind = f"mid-stream/{how}"
                        else:
                            kind = "ended_early"
            except TimeoutError:
                hung += 1
                kind = "hung"
            except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
                errors += 1
                kind = "connection_error"
            finally:
                if s is not None:
                    s.close(how)
            _count(kinds, kind)
            ids[rid] = kind

    await asyncio.gather(*(loop() for _ in range(clients)))
    ok, value = await settle(session, proxy_slots(session, proxy_url))
    return {"disconnects": sum(kinds.values()), "kinds": kinds, "hung": hung, "connection_errors": errors, "slots_after": value,
            "leaked_after": not ok, "ids": ids}


def logged_statuses(log: Path, ids: dict[str, str]) -> dict:
    """How the proxy logged each disconnected request (by its X-Request-Id): {kind: {status: n}}."""
    seen: dict[str, int] = {}
    try:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"request"' in line:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("request_id") in ids:
                    seen[e["request_id"]] = e.get("status")
    except FileNotFoundError:
        pass
    out: dict[str, dict] = {}
    for rid, kind in ids.items():
        _count(out.setdefault(kind, {}), str(seen.get(rid, "not logged")))
    return out


def status_totals(by_kind: dict) -> dict:
    totals: dict = {}
    for statuses in by_kind.values():
        for status, n in statuses.items():
            totals[status] = totals.get(status, 0) + n
    return totals


async def serves_again(session, proxy_url: str, bodies: list[dict]) -> dict:
    tally = LoadTally()
    await asyncio.gather(*(one_request(session, proxy_url, b, tally, HANG_SECONDS) for b in bodies))
    return {"sent": tally.sent, "statuses": tally.statuses, "streams_done": tally.streams_done, "unanswered": tally.unanswered}


async def fake_disconnects(session, workdir: Path, n: int, deadline: float) -> dict:
    setup = FakeSetup(workdir, "fake-disconnects", [(f"d{i}", f"m{i}", 2) for i in range(4)], max_waiting=16)
    say(f"fake disconnects: {n} from 16 clients over {len(setup.fakes)} upstreams of gate 2")
    try:
        await setup.start(session)
        m0 = await get_metrics(session, setup.proxy.url)
        models = [f.model for f in setup.fakes]
        r = await disconnects(
            session, setup.proxy.url, setup.proxy.port, models, n, 16,
            # a plain answer takes 0.5 s, so a client leaving after 20-80 ms leaves before it
            lambda model, stream: {"model": model, "prompt": "long", "stream": stream, "x_fake": LONG_STREAM if stream else {"delay": 0.5}},
            deadline,
        )

        async def upstreams_idle():
            stats = await setup.stats(session)
            return all(v.get("active") == 0 for v in stats.values()), stats

        # The proxy frees its slot first and then closes the upstream connection, so the
        # upstream notices a moment later: poll, and report how long it took.
        t_idle = time.monotonic()
        _, stats = await settle(session, upstreams_idle)
        idle_seconds = time.monotonic() - t_idle
        m1 = await get_metrics(session, setup.proxy.url)
        again = await serves_again(session, setup.proxy.url, [{"model": m, "prompt": "x", "stream": True} for m in models for _ in range(2)])
        by_kind = logged_statuses(setup.proxy.log, r.pop("ids"))
        result = {
            "target": "fake", "requested": n, **r, "proxy_logged": status_totals(by_kind), "proxy_logged_by_kind": by_kind,
            "proxy_499": _delta(m0, m1, "mtpstack_proxy_requests_total", "499"),
            "upstream_active_after": {k: v.get("active") for k, v in stats.items()}, "upstream_idle_after_seconds": round(idle_seconds, 2),
            "upstream_cancelled": sum(v.get("cancelled", 0) for v in stats.values()),
            "upstream_violations": sum(v.get("violations", 0) for v in stats.values()),
            "serves_again": again,
        }
        say(f"fake disconnects: {r['kinds']}, slots after: {r['slots_after']}, upstream active: {result['upstream_active_after']}")
        return result
    finally:
        setup.stop()


def _delta(m0: dict, m1: dict, name: str, status: str) -> int:
    total = lambda m: sum(v for k, v in m.get(name, {}).items() if ("status", status) in k)  # noqa: E731
    return int(total(m1) - total(m0))


# -- the real stack ----------------------------------------------------------------------------
class RealStack:
    """`mtpstack up` as a subprocess: one native worker on tiny models, width 2, gate 2."""

    def __init__(self, workdir: Path, target: Path, drafter: Path, width: int = 2):
        self.dir = workdir / "real"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.width = width
        config = {
            "proxy": {
                "host": HOST, "port": self.port, "modelConcurrencyLimits": {"tiny": width},
                "queue": {"maxWaiting": 32, "timeoutSeconds": 120}, "shutdownGraceSeconds": 2,
            },
            "workers": {
                "w0": {
                    "model": "tiny", "target": {"path": str(target), "bits": "fp32"},
                    "drafter": {"path": str(drafter), "bits": "fp32", "depth": 3},
                    "maxNumSeqs": width, "host": HOST, "port": free_port(),
                }
            },
        }
        self.config_path = self.dir / "fleet.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.run_dir = self.dir / "run"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def state(self) -> dict:
        try:
            return json.loads((self.run_dir / "state.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def pids(self) -> list[int]:
        s = self.state()
        return [p for p in [s.get("proxy", {}).get("pid"), *(w.get("pid") for w in s.get("workers", {}).values())] if p]

    def worker(self) -> dict:
        return self.state().get("workers", {}).get("w0", {})

    async def start(self, session) -> None:
        argv = [sys.executable, "-m", "mtpstack", "up", str(self.config_path), "--run-dir", str(self.run_dir), "--health-timeout", "180"]
        self.proc = CHILDREN.start(argv, self.dir / "up.log")
        await wait_status(session, self.url + "/readyz", self.proc, 240, "`mtpstack up`")
        CHILDREN.extra_pids.extend(self.pids())

    def stop(self) -> None:
        pids = self.pids()
        if self.proc is not None:
            CHILDREN.stop(self.proc, timeout=45)
        for pid in pids:
            kill_if_ours(pid)  # only if `mtpstack up` left one behind


def real_body(i: int, model: str = "tiny", max_tokens: int | None = None, stream: bool | None = None) -> dict:
    rng = random.Random(i)
    stream = rng.random() < 0.5 if stream is None else stream
    n = max_tokens or rng.randint(8, 32)
    if i % 2:
        return {"model": model, "messages": [{"role": "user", "content": f"Write a function number {i}."}], "max_tokens": n, "temperature": 0, "stream": stream}
    return {"model": model, "prompt": f"def f{i}(x):\n", "max_tokens": n, "temperature": 0, "stream": stream}


async def real_phase(session, workdir: Path, out: dict, *, requests: int, clients: int, n_disconnects: int, kills: int, deadline: float) -> None:
    """Fills `out` as it goes, so a failure part-way keeps the figures of what finished."""
    from devkit.demo.tiny import build_tiny_pair

    say("real: building tiny models and starting `mtpstack up`")
    target, drafter = build_tiny_pair(workdir / "models", seed=0)
    stack = RealStack(workdir, target, drafter)
    out.update({"width": stack.width, "gate": stack.width})
    try:
        await _real_steps(session, stack, out, requests=requests, clients=clients, n_disconnects=n_disconnects, kills=kills, deadline=deadline)
    except Exception as e:
        log = stack.dir / "up.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-12:]) if log.exists() else ""
        raise RuntimeError(f"{e}\n`mtpstack up` log tail ({log}):\n{tail}") from e
    finally:
        stack.stop()


async def _real_steps(session, stack: RealStack, out: dict, *, requests: int, clients: int, n_disconnects: int, kills: int, deadline: float) -> None:
    t0 = time.monotonic()
    await stack.start(session)
    out["startup_seconds"] = round(time.monotonic() - t0, 1)
    worker_url = stack.worker()["url"]
    proxy_pid = stack.state()["proxy"]["pid"]

    # load
    say(f"real load: {requests} requests from {clients} clients")
    w0 = await get_metrics(session, worker_url)
    before = memory_kib(proxy_pid)
    tally = LoadTally()
    targets = {"proxy_inflight{worker=w0}": (stack.url, "mtpstack_proxy_inflight", {"worker": "w0"}),
               "worker_active_sequences": (worker_url, "mtpstack_worker_active_sequences", {})}
    t0 = time.monotonic()
    with GaugeSampler(session, targets, interval=0.1) as sampler:
        complete = await drive(session, stack.url, requests, clients, real_body, tally, 180.0, deadline)
    seconds = time.monotonic() - t0
    await asyncio.sleep(1.0)
    after = memory_kib(proxy_pid)
    w1 = await get_metrics(session, worker_url)
    full = lambda m: sample(m, "mtpstack_worker_rejected_total", code="worker_full") or 0.0  # noqa: E731
    out["load"] = {
        "label": "real-gate2", "target": "real", "gate": stack.width, "upstreams": 1, "clients": clients, "max_waiting": 32,
        "capacity": stack.width + 32, "queue_bound_reachable": clients > stack.width + 32,
        "requested": requests, "complete": complete, **tally_dict(tally, seconds),
        "worker_full_rejections": int(full(w1) - full(w0)),
        "sampled_max": {k: sampler.max.get(k) for k in targets}, "samples": sampler.samples,
        "tokens_generated": int((sample(w1, "mtpstack_worker_tokens_generated_total") or 0) - (sample(w0, "mtpstack_worker_tokens_generated_total") or 0)),
        "proxy_rss_kib": {"before": before.get("VmRSS"), "after": after.get("VmRSS"), "peak": after.get("VmHWM")},
    }
    say(f"real load: {tally.statuses} in {seconds:.1f} s, sampled max {out['load']['sampled_max']}")

    # disconnects
    if n_disconnects:
        say(f"real disconnects: {n_disconnects} from 4 clients")
        m0 = await get_metrics(session, stack.url)
        wm0 = await get_metrics(session, worker_url)
        r = await disconnects(
            session, stack.url, stack.port, ["tiny"], n_disconnects, 4,
            lambda model, stream: real_body(0, model, max_tokens=400, stream=stream), deadline,
        )

        async def worker_idle():
            m = await get_metrics(session, worker_url)
            v = sample(m, "mtpstack_worker_active_sequences")
            return v == 0, v

        t_idle = time.monotonic()
        idle, active = await settle(session, worker_idle)
        idle_seconds = time.monotonic() - t_idle
        m1 = await get_metrics(session, stack.url)
        wm1 = await get_metrics(session, worker_url)
        tokens = lambda m: sample(m, "mtpstack_worker_tokens_generated_total") or 0.0  # noqa: E731
        again = await serves_again(session, stack.url, [real_body(i, max_tokens=8) for i in range(2)])
        by_kind = logged_statuses(stack.run_dir / "logs" / "proxy.log", r.pop("ids"))
        out["disconnects"] = {
            "target": "real", "requested": n_disconnects, **r, "proxy_logged": status_totals(by_kind), "proxy_logged_by_kind": by_kind, "proxy_499": _delta(m0, m1, "mtpstack_proxy_requests_total", "499"),
            # each stream asked for 400 tokens: a worker that ignored the disconnects would generate them all
            "tokens_generated": int(tokens(wm1) - tokens(wm0)), "tokens_if_never_stopped": 400 * r["disconnects"],
            # how long the worker still had active sequences once the last client had left
            "worker_idle_after_seconds": round(idle_seconds, 2),
            "worker_active_sequences_after": active, "worker_leaked_after": not idle, "serves_again": again,
        }
        say(f"real disconnects: {r['kinds']}, slots after {r['slots_after']}, worker active {active}")

    # kills
    if kills:
        say(f"real kills: {kills} SIGKILLs of the worker mid-stream; `mtpstack up` restarts it with backoff")
        rounds = []
        for i in range(kills):
            if time.monotonic() > deadline:
                break
            await wait_status(session, stack.url + "/readyz", stack.proc, min(180, max(1, deadline - time.monotonic())), "the restarted worker", "`mtpstack up`")
            pid = stack.worker()["pid"]

            def kill(pid=pid):
                _killpg(pid)

            rounds.append(await kill_round(session, stack.url, stack.port, real_body(i, max_tokens=400, stream=True), kill, "w0"))
            end = time.monotonic() + 60
            while stack.worker().get("pid") in (None, pid) and time.monotonic() < end:
                await asyncio.sleep(0.2)
            CHILDREN.extra_pids.extend(stack.pids())
            say(f"real kills: {i + 1} done: {rounds[-1]['outcomes']}")
        back = True
        try:
            await wait_status(session, stack.url + "/readyz", stack.proc, 180, "the restarted worker", "`mtpstack up`")
        except RuntimeError:
            back = False
        ok, value = await settle(session, proxy_slots(session, stack.url))
        again = await serves_again(session, stack.url, [real_body(i, max_tokens=8) for i in range(2)]) if back else None
        out["kills"] = {
            "target": "real", "requested": kills, **summarize_rounds(rounds), "slots_after": value, "leaked_after": not ok,
            "restarts": stack.worker().get("restarts"), "serves_again": again,
        }


# -- report (pure) -----------------------------------------------------------------------------
def table(headers: list[str], rows: list[list]) -> list[str]:
    """Left-aligned columns, two spaces apart; None shows as `-`."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def mib(kib: int | None) -> str | None:
    return None if kib is None else f"{kib / 1024:.1f}"


def _statuses(r: dict) -> str:
    parts = [f"{r['statuses'].get('200', 0)} x 200"]
    for code, n in sorted(r.get("error_codes", {}).items()):
        parts.append(f"{n} x {code}")
    return ", ".join(parts)


def load_lines(rows: list[dict]) -> list[str]:
    headers = ["target", "gate", "ups", "clients", "maxWaiting", "requests", "answers", "unanswered", "streams ok",
               "max conc. per upstream", "proxy inflight max", "proxy RSS MiB before/half/after/peak", "req/s", "s"]
    out = []
    for r in rows:
        if r.get("target") == "fake":
            conc = ", ".join(str(v) for v in r["upstream_max_concurrency"].values())
            inflight = max((v or 0) for k, v in r["sampled_max"].items() if k.startswith("inflight"))
        else:
            conc = f"{_int(r['sampled_max'].get('worker_active_sequences'))} (sampled)"
            inflight = r["sampled_max"].get("proxy_inflight{worker=w0}")
        rss = r["proxy_rss_kib"]
        out.append([r["target"], r["gate"], r["upstreams"], r["clients"], r["max_waiting"], r["sent"], _statuses(r), r["unanswered"],
                    f"{r['streams_done']}/{r['streams']}", conc, _int(inflight),
                    "/".join(mib(rss.get(k)) or "-" for k in ("before", "half", "after", "peak")), r["requests_per_second"], r["seconds"]])
    return table(headers, out)


def _int(v) -> int | None:
    return None if v is None else int(v)


def _outcomes(d: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(d.items(), key=lambda kv: -kv[1]))


def fault_lines(result: dict) -> list[str]:
    rows = []
    for key in ("fake_kills", "real_kills"):
        r = result.get(key)
        if r:
            leaked = f"{r['rounds_with_leaked_slot']} rounds; after: {_slots(r['slots_after'])}"
            rows.append(["worker SIGKILL mid-stream", r["target"], r["kills"], r["clients"], r["hung"], leaked, _outcomes(r["outcomes"]), None])
    r = result.get("fake_failover")
    if r:
        leaked = f"{r['rounds_with_leaked_slot']} rounds; after: {_slots(r['slots_after'])}"
        after = r["requests_after_failure"]
        answered = ", ".join(f"{n} x {k}" for k, n in sorted(after["statuses"].items())) or "none"
        rows.append(["SIGKILL, 1 of 2 workers", r["target"], r["kills"], r["clients"], r["hung"], leaked, _outcomes(r["outcomes"]),
                     f"then {answered} of {after['sent']}"])
    for key in ("fake_disconnects", "real_disconnects"):
        r = result.get(key)
        if r:
            logged = ", ".join(f"{n} x {k}" for k, n in sorted(r.get("proxy_logged", {}).items())) or None
            rows.append(["client disconnect", r["target"], r["disconnects"], r["disconnects"], r["hung"], f"after: {_slots(r['slots_after'])}",
                         _outcomes(r["kinds"]), logged])
    return table(["fault", "target", "count", "clients", "hung", "leaked proxy slots", "client outcomes", "proxy logged"], rows)


def _slots(v) -> str:
    if not isinstance(v, dict):
        return str(v)
    return f"inflight {_int(v.get('inflight'))}, queued {_int(v.get('queue_depth'))}"


def checks(result: dict) -> list[tuple[bool, str]]:
    """(passed, sentence) for every property the run must show."""
    out: list[tuple[bool, str]] = []
    for r in result.get("load", []):
        name = f"{r['target']} gate {r['gate']}, maxWaiting {r['max_waiting']}"
        out.append((r["unanswered"] == 0, f"{name}: requests unanswered: {r['unanswered']}"))
        out.append((r.get("complete", True), f"{name}: all {r['requested']} requests sent before the deadline: {r['sent']}"))
        if r["target"] == "fake":
            conc = list(r["upstream_max_concurrency"].values())
            out.append((all(c == r["gate"] for c in conc), f"{name}: largest concurrency each upstream saw equals the gate {r['gate']}: {conc}"))
            out.append((r["upstream_violations"] == 0, f"{name}: requests an upstream refused above its gate: {r['upstream_violations']}"))
            out.append((r["inflight_after"] == 0, f"{name}: proxy inflight after the run: {r['inflight_after']}"))
        else:
            active = r["sampled_max"].get("worker_active_sequences")
            out.append((active is not None and active <= r["gate"], f"{name}: worker active sequences never above the gate (sampled max): {_int(active)}"))
            out.append((r["worker_full_rejections"] == 0, f"{name}: worker_full 429s from the worker: {r['worker_full_rejections']}"))
        inflight = [v for k, v in r["sampled_max"].items() if "inflight" in k]
        out.append((all(v is not None and v <= r["gate"] for v in inflight), f"{name}: proxy inflight never above the gate (sampled max): {[_int(v) for v in inflight]}"))
        others = {k: n for k, n in r["error_codes"].items() if k != "429 queue_full"}
        out.append((not others, f"{name}: answers other than 200 and 429 queue_full: {others or 0}"))
        qf = r["error_codes"].get("429 queue_full", 0)
        if r["queue_bound_reachable"]:
            out.append((qf > 0 and r["retry_after_missing"] == 0, f"{name}: the queue bound was hit and every 429 queue_full had Retry-After: {qf} (without: {r['retry_after_missing']}; values: {r.get('retry_after_values') or {}})"))
        else:
            out.append((qf == 0, f"{name}: 429 queue_full while the queue had room for every client: {qf}"))
        out.append((r["stream_errors"] + r["stream_truncated"] == 0, f"{name}: streams ending without [DONE]: {r['stream_errors'] + r['stream_truncated']}"))
    for key in ("fake_kills", "real_kills"):
        r = result.get(key)
        if r:
            name = f"{r['target']} worker kills ({r['kills']} of {r['requested']})"
            out.append((r["kills"] == r["requested"], f"{name}: kills done before the deadline: {r['kills']}"))
            out.append((r["hung"] == 0, f"{name}: hung clients: {r['hung']}"))
            out.append((r["rounds_with_leaked_slot"] == 0 and not r["leaked_after"], f"{name}: leaked slots: {r['rounds_with_leaked_slot']} rounds, after settling {r['slots_after']}"))
            out.append((r["admitted_streams_cut_without_error_event"] == 0, f"{name}: streams cut without an error event: {r['admitted_streams_cut_without_error_event']}"))
    r = result.get("fake_failover")
    if r:
        name = f"fake failover ({r['kills']} of {r['requested']})"
        out.append((r["kills"] == r["requested"], f"{name}: kills done before the deadline: {r['kills']}"))
        out.append((r["hung"] == 0, f"{name}: hung clients: {r['hung']}"))
        out.append((r["rounds_with_leaked_slot"] == 0 and not r["leaked_after"], f"{name}: leaked slots: {r['rounds_with_leaked_slot']} rounds, after settling {r['slots_after']}"))
        want = {"done": r["kills"], "error_event": r["kills"]}
        out.append((r["outcomes"] == want, f"{name}: the stream on the dead worker ends with an error event, the one on the survivor with [DONE]: {r['outcomes']}"))
        after = r["requests_after_failure"]
        out.append((after["sent"] > 0 and after["statuses"].get("200", 0) == after["sent"],
                    f"{name}: requests right after the failure answered 200 (by the survivor): {after['statuses'].get('200', 0)} of {after['sent']} {after['error_codes'] or ''}".rstrip()))
    for key in ("fake_disconnects", "real_disconnects"):
        r = result.get(key)
        if r:
            name = f"{r['target']} client disconnects ({r['disconnects']} of {r['requested']})"
            out.append((r["disconnects"] == r["requested"], f"{name}: disconnects done before the deadline: {r['disconnects']}"))
            out.append((r["hung"] == 0, f"{name}: hung clients: {r['hung']}"))
            out.append((not r["leaked_after"], f"{name}: leaked proxy slots after settling: {r['slots_after']}"))
            if "upstream_active_after" in r:
                active = sum((v or 0) for v in r["upstream_active_after"].values())
                out.append((active == 0, f"{name}: requests still active in the upstreams after settling: {active}"))
            if "worker_active_sequences_after" in r:
                out.append((not r["worker_leaked_after"], f"{name}: worker active sequences after settling: {_int(r['worker_active_sequences_after'])}"))
            if "proxy_logged" in r:
                other = {k: n for k, n in r["proxy_logged"].items() if k != "499"}
                out.append((not other, f"{name}: disconnects the proxy logged with a status other than 499: {other or 0}"))
            if "tokens_generated" in r:
                out.append((r["tokens_generated"] < r["tokens_if_never_stopped"],
                            f"{name}: tokens the worker generated for them: {r['tokens_generated']} (at most {r['tokens_if_never_stopped']} if it never stopped)"))
            again = r.get("serves_again") or {}
            out.append((again.get("unanswered", 1) == 0 and again.get("statuses", {}).get("200", 0) == again.get("sent", -1),
                        f"{name}: every model serves again afterwards: {again.get('statuses')}"))
    return out


def report_lines(result: dict) -> list[str]:
    meta = result["meta"]
    lines = [f"mtpstack load bench, {meta['date']}", f"command: {meta['command']}",
             f"machine: {meta['cpus']} CPUs, {meta['platform']}, Python {meta['python']}, commit {meta['commit']}, {meta['seconds']} s"]
    if meta.get("modified"):
        lines.append("uncommitted changes in the checkout: " + ", ".join(meta["modified"]))
    lines.append("")
    lines += ["Load (answers by status; streams ok = streamed requests that ended with [DONE])", *load_lines(result.get("load", [])), ""]
    lines += ["Faults (hung = no end, error or status within %g s; leaked = proxy inflight or queue not back to 0 within %g s)" % (HANG_SECONDS, SETTLE_SECONDS),
              *fault_lines(result), ""]
    cs = checks(result)
    lines.append(f"Checks: {sum(ok for ok, _ in cs)} of {len(cs)} hold")
    lines += [f"  {'ok  ' if ok else 'FAIL'}  {text}" for ok, text in cs]
    for note in result.get("errors", []):
        lines.append(f"  FAIL  phase did not finish: {note}")
    return lines


# -- main ----------------------------------------------------------------------------------------
QUICK = {"requests": 2000, "bound_requests": 300, "kills": 10, "failovers": 4, "disconnects": 100, "real_requests": 40, "real_disconnects": 20, "real_kills": 1, "deadline": 240}
FULL = {"requests": 20000, "bound_requests": 2000, "kills": 100, "failovers": 20, "disconnects": 1000, "real_requests": 300, "real_disconnects": 200, "real_kills": 5, "deadline": 900}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/scripts/load_bench.py", description="Load and fault figures for the proxy and `mtpstack up`.")
    ap.add_argument("--quick", action="store_true", help="a smoke run of about a minute (smaller counts)")
    ap.add_argument("--out", default="load-bench.json", help="where the raw figures go (default: load-bench.json)")
    ap.add_argument("--skip-real", action="store_true", help="fake upstreams only (no mlx needed)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs, tiny models)")
    for key in FULL:
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=None, help=f"(default: {FULL[key]}, --quick: {QUICK[key]})")
    args = ap.parse_args(argv)
    base = QUICK if args.quick else FULL
    for key in FULL:
        if getattr(args, key) is None:
            setattr(args, key, base[key])
    return args


def _modified() -> list[str]:
    """Tracked files changed in the checkout (shared checkouts run what is on disk, not HEAD)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line[3:] for line in out.splitlines()]


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


async def run(args: argparse.Namespace, workdir: Path) -> dict:
    started = time.monotonic()
    deadline = started + args.deadline
    result: dict = {"meta": {}, "load": [], "errors": []}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        phases = []
        real: dict = {}
        for gate in (2, 4):
            phases.append((f"fake load gate {gate}", lambda g=gate: fake_load(session, workdir, gate=g, requests=args.requests, clients=64, max_waiting=64, deadline=deadline), "load"))
        for gate in (2, 4):
            phases.append((f"fake queue bound gate {gate}", lambda g=gate: fake_load(session, workdir, gate=g, requests=args.bound_requests, clients=64, max_waiting=16, deadline=deadline), "load"))
        phases.append(("fake kills", lambda: fake_kills(session, workdir, args.kills, deadline), "fake_kills"))
        phases.append(("fake failover", lambda: fake_failover(session, workdir, args.failovers, deadline), "fake_failover"))
        phases.append(("fake disconnects", lambda: fake_disconnects(session, workdir, args.disconnects, deadline), "fake_disconnects"))
        if not args.skip_real:
            phases.append(("real stack", lambda: real_phase(session, workdir, real, requests=args.real_requests, clients=16,
                                                             n_disconnects=args.real_disconnects, kills=args.real_kills, deadline=deadline), "real"))
        for name, phase, key in phases:
            if time.monotonic() > deadline:
                result["errors"].append(f"{name}: not started, the run's deadline of {args.deadline} s passed")
                continue
            try:
                r = await phase()
            except Exception as e:  # noqa: BLE001 - one failed phase must not hide the others' figures
                say(f"{name} failed: {type(e).__name__}: {e}")
                result["errors"].append(f"{name}: {type(e).__name__}: {e}")
                if key != "real":
                    continue
                r = real  # what the real phase measured before it failed
            if key == "load":
                result["load"].append(r)
            elif key == "real":
                r = real
                if "load" in r:
                    result["load"].append(r["load"])
                if "disconnects" in r:
                    result["real_disconnects"] = r["disconnects"]
                if "kills" in r:
                    result["real_kills"] = r["kills"]
                result["real_startup_seconds"] = r.get("startup_seconds")
            else:
                result[key] = r
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="mtpstack-load-bench-"))
    say(f"work directory: {workdir}")

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (SIGINT ignored)
    t0 = time.monotonic()
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        result = asyncio.run(run(args, workdir))
    except KeyboardInterrupt:
        say("interrupted; stopping every process started here")
        CHILDREN.stop_all()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return 130
    finally:
        CHILDREN.stop_all()
    result["meta"] = {
        "date": date, "command": " ".join(shlex.quote(a) for a in ["bench/scripts/load_bench.py", *(sys.argv[1:] if argv is None else argv)]),
        "cpus": os.cpu_count(), "platform": platform.platform(terse=True), "python": platform.python_version(), "commit": _commit(), "modified": _modified(),
        "seconds": round(time.monotonic() - t0), "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "settings": {k: getattr(args, k) for k in FULL},
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print("\n".join(report_lines(result)))
    say(f"figures written to {args.out}")
    ok = all(passed for passed, _ in checks(result)) and not result["errors"]
    if args.keep or not ok:
        say(f"work directory kept{'' if ok else ' for its logs'}: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
