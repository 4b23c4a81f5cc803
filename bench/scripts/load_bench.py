"""Load and fault figures for the whole stack: the gates hold under load, and faults leave no
hung client and no leaked slot.

    .venv/bin/python bench/scripts/load_bench.py [--quick] [--out load-bench.json] [--skip-real] [--real-failovers N]

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
5. A worker killed under load (`--real-failovers`): `mtpstack up` with two native workers of one
   model (gate 2 each), 6 clients sending with pauses of 0-0.4 s (half streamed), `w0` SIGKILLed
   each time both serve (it restarts), in turn while it holds requests and while it holds none.
   Every request's outcome is matched with the proxy's log line: an error counts as taken by the
   dead worker when the request was sent to it before a kill and ended after; every other error
   fails the run (issue 40's goal: none).

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
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from devkit.fake_fleet import FakeFleet, FakeUpstream
from devkit.raw_http import RawStream
from mtpstack import series
from mtpstack.proxy.prometheus import parse_samples, sample
from mtpstack.runtime import Process, Processes, StartError, free_port, signal_group, tail_text, url_of

from load_report import HANG_SECONDS, SETTLE_SECONDS, checks, failover_counts, report_lines  # beside this script

ROOT = _checkout.ROOT
HOST = "127.0.0.1"
#: Fake upstream pacing under load: short enough that the proxy is the bottleneck, long enough
#: that requests overlap inside an upstream (an instant plain answer never yields).
LOAD_DELAY, LOAD_CHUNKS, LOAD_INTERVAL = 0.001, 8, 0.001
#: A stream long enough to be cut in the middle: 2,000 chunks 5 ms apart (10 s).
LONG_STREAM = {"chunks": 2000, "interval": 0.005}
STREAM_EVERY = 4  # every 4th load request is streamed


# -- child processes ------------------------------------------------------------------------
#: Every process this script started, so all of them die at exit, also on Ctrl-C.
CHILDREN = Processes()
#: Processes `mtpstack up` started for this script, killed at exit if `mtpstack up` left one behind.
UP_CHILDREN: list[int] = []


def kill_if_ours(pid: int) -> None:
    """SIGKILL a process `mtpstack up` started for us, if it still runs (a pid can be reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return
    if b"mtpstack" in cmdline:
        signal_group(pid, signal.SIGKILL)


def stop_all() -> None:
    CHILDREN.stop_all(timeout=15)
    for pid in UP_CHILDREN:
        kill_if_ours(pid)


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


# -- Prometheus text (parsed by `mtpstack.proxy.prometheus`) ---------------------------------
async def get_metrics(session: aiohttp.ClientSession, url: str) -> dict:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return parse_samples(await r.text())
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


# -- the fake setups ----------------------------------------------------------------------------
def fake_setup(workdir: Path, label: str, fakes: list[tuple[str, str, int]], max_waiting: int, queue_timeout: float = 60.0) -> FakeFleet:
    """Fake upstreams, paced for load, behind a proxy whose gates are theirs and whose queue holds `max_waiting`."""
    gates = {model: gate for _, model, gate in fakes}
    proxy = {
        "modelConcurrencyLimits": gates,
        "queue": {"maxWaiting": max_waiting, "timeoutSeconds": queue_timeout},
        "timeouts": {"connectSeconds": 5, "firstByteSeconds": 60, "idleSeconds": 30},
        "shutdownGraceSeconds": 2,
    }
    pacing = ["--delay", str(LOAD_DELAY), "--chunks", str(LOAD_CHUNKS), "--interval", str(LOAD_INTERVAL)]
    return FakeFleet(workdir / label, fakes, proxy, fake_args=pacing, processes=CHILDREN)


async def start_setup(setup: FakeFleet) -> None:
    await asyncio.to_thread(setup.start)


async def upstream_stats(session: aiohttp.ClientSession, setup: FakeFleet) -> dict[str, dict]:
    """Each fake's own count of what it served (`/stats`), by name."""
    return {f.name: (await get_json(session, f.url + "/stats"))[1] for f in setup.fakes}


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
    setup = fake_setup(workdir, label, [(f"u{i}", "fake", gate) for i in range(2)], max_waiting)
    try:
        await start_setup(setup)
        pid = setup.proxy.pid
        before = memory_kib(pid)
        tally = LoadTally()
        targets = {f"inflight{{worker={f.name}}}": (setup.url, "mtpstack_proxy_inflight", {"worker": f.name}) for f in setup.fakes}
        targets["queue_depth{model=fake}"] = (setup.url, "mtpstack_proxy_queue_depth", {"model": "fake"})
        t0 = time.monotonic()
        with GaugeSampler(session, targets, interval=0.1) as sampler:
            # in two halves, to tell a one-time growth of the proxy's memory from a steady one
            half = requests // 2
            complete = await drive(session, setup.url, half, clients, fake_body("fake"), tally, 90.0, deadline)
            middle = memory_kib(pid)
            complete &= await drive(session, setup.url, requests, clients, fake_body("fake"), tally, 90.0, deadline, start=half)
        seconds = time.monotonic() - t0
        await asyncio.sleep(1.0)
        after = memory_kib(pid)
        stats = await upstream_stats(session, setup)
        m = await get_metrics(session, setup.url)
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


# -- streaming clients for faults (`devkit.raw_http.RawStream`) ----------------------------------
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
            streams.append(await RawStream.open(HOST, proxy_port, body))
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
    setup = fake_setup(workdir, "fake-kills", [(f"k{i}", f"m{i}", 2) for i in range(4)], max_waiting=8)
    say(f"fake kills: {kills} SIGKILLs mid-stream over {len(setup.fakes)} upstreams")
    rounds: list[dict] = []
    try:
        await start_setup(setup)
        for i in range(kills):
            if time.monotonic() > deadline:
                break
            f = setup.fakes[i % len(setup.fakes)]
            await _await_healthy(session, setup.url, f, deadline)
            body = {"model": f.model, "prompt": "long", "stream": True, "x_fake": LONG_STREAM}

            def kill(f=f):
                f.kill()
                f.start()  # back in the background; the proxy's health check picks it up

            r = await kill_round(session, setup.url, setup.port, body, kill, f.name)
            rounds.append(r)
            if (i + 1) % 20 == 0:
                say(f"fake kills: {i + 1} done")
        ok, value = await settle(session, proxy_slots(session, setup.url))
        result = {"target": "fake", "requested": kills, **summarize_rounds(rounds), "slots_after": value, "leaked_after": not ok}
        say(f"fake kills: {result['outcomes']}, leaked after: {value}")
        return result
    finally:
        setup.stop()


async def fake_failover(session, workdir: Path, n: int, deadline: float) -> dict:
    """A model served by two upstreams: one stream on each, SIGKILL the first upstream mid-stream.
    The stream on the other must finish, and once the dead one's stream has its error event (the
    proxy has then marked it unhealthy), new requests must be answered by the survivor."""
    setup = fake_setup(workdir, "fake-failover", [("f0", "mm", 2), ("f1", "mm", 2)], max_waiting=8)
    say(f"fake failover: {n} SIGKILLs of one of two upstreams of a model")
    rounds: list[dict] = []
    after = LoadTally()
    try:
        await start_setup(setup)
        victim = setup.fakes[0]
        for i in range(n):
            if time.monotonic() > deadline:
                break
            for f in setup.fakes:
                await _await_healthy(session, setup.url, f, deadline)
            # both idle: the first stream goes to f0 (config order), the second to f1 (least loaded)
            body = {"model": "mm", "prompt": "long", "stream": True, "x_fake": {"chunks": 200, "interval": 0.005}}

            def kill():
                victim.kill()
                victim.start()

            streams = []
            outcomes = []
            try:
                for _ in range(2):
                    streams.append(await RawStream.open(HOST, setup.port, body))
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
            await asyncio.gather(*(one_request(session, setup.url, {"model": "mm", "prompt": "x"}, after, HANG_SECONDS) for _ in range(4)))
            ok, value = await settle(session, proxy_slots(session, setup.url))
            rounds.append({"admitted_before_kill": 2, "outcomes": outcomes, "slot_leaked": not ok, "after": value})
        ok, value = await settle(session, proxy_slots(session, setup.url))
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


async def _await_healthy(session, proxy_url: str, f: FakeUpstream, deadline: float) -> None:
    end = min(deadline, time.monotonic() + 60)
    while time.monotonic() < end:
        if not f.process.alive():  # the restart lost a race for the port: try again
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
                    s = await RawStream.open(HOST, proxy_port, body_for(model, early != "plain"), rid)
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
    setup = fake_setup(workdir, "fake-disconnects", [(f"d{i}", f"m{i}", 2) for i in range(4)], max_waiting=16)
    say(f"fake disconnects: {n} from 16 clients over {len(setup.fakes)} upstreams of gate 2")
    try:
        await start_setup(setup)
        m0 = await get_metrics(session, setup.url)
        models = [f.model for f in setup.fakes]
        r = await disconnects(
            session, setup.url, setup.port, models, n, 16,
            # a plain answer takes 0.5 s, so a client leaving after 20-80 ms leaves before it
            lambda model, stream: {"model": model, "prompt": "long", "stream": stream, "x_fake": LONG_STREAM if stream else {"delay": 0.5}},
            deadline,
        )

        async def upstreams_idle():
            stats = await upstream_stats(session, setup)
            return all(v.get("active") == 0 for v in stats.values()), stats

        # The proxy frees its slot first and then closes the upstream connection, so the
        # upstream notices a moment later: poll, and report how long it took.
        t_idle = time.monotonic()
        _, stats = await settle(session, upstreams_idle)
        idle_seconds = time.monotonic() - t_idle
        m1 = await get_metrics(session, setup.url)
        again = await serves_again(session, setup.url, [{"model": m, "prompt": "x", "stream": True} for m in models for _ in range(2)])
        by_kind = logged_statuses(setup.log, r.pop("ids"))
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
    """`mtpstack up` as a subprocess: native workers (`w0`, `w1`...) on tiny models, width 2, gate 2.
    What it started (pids, addresses, restarts) is read as `mtpstack status --format json` reports it."""

    def __init__(self, workdir: Path, target: Path, drafter: Path, width: int = 2, workers: int = 1, name: str = "real"):
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.width = width
        config = {
            "proxy": {
                "host": HOST, "port": self.port, "modelConcurrencyLimits": {"tiny": width},
                "queue": {"maxWaiting": 32, "timeoutSeconds": 120}, "shutdownGraceSeconds": 2,
            },
            "workers": {
                f"w{i}": {
                    "model": "tiny", "target": {"path": str(target), "bits": "fp32"},
                    "drafter": {"path": str(drafter), "bits": "fp32", "depth": 3},
                    "maxNumSeqs": width, "host": HOST, "port": free_port(),
                }
                for i in range(workers)
            },
        }
        self.config_path = self.dir / "fleet.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.run_dir = self.dir / "run"
        self.url = url_of(HOST, self.port)
        self.log = self.dir / "up.log"
        self.proc: Process | None = None

    def status(self) -> dict:
        """`mtpstack status`'s document for this run; {} before `mtpstack up` has written its run directory."""
        from mtpstack.status import StatusError, collect

        try:
            return collect(self.run_dir)
        except StatusError:
            return {}

    async def astatus(self) -> dict:
        return await asyncio.to_thread(self.status)  # it asks the processes over HTTP

    def pids(self, status: dict) -> list[int]:
        return [p for p in [status.get("proxy", {}).get("pid"), *(w.get("pid") for w in status.get("workers", {}).values())] if p]

    async def worker(self, name: str = "w0") -> dict:
        return (await self.astatus()).get("workers", {}).get(name, {})

    async def wait_ready(self, timeout: float) -> None:
        """Until the proxy is ready; `runtime.StartError` when `mtpstack up` exits first or `timeout` passes."""
        await asyncio.to_thread(self.proc.wait_ready, "/readyz", timeout)

    async def start(self) -> None:
        argv = [sys.executable, "-m", "mtpstack", "up", str(self.config_path), "--run-dir", str(self.run_dir), "--health-timeout", "180"]
        self.proc = CHILDREN.start(argv, log_path=self.log, name="mtpstack up", kind="stack", url=self.url, cwd=ROOT)
        await self.wait_ready(240)
        UP_CHILDREN.extend(self.pids(await self.astatus()))

    def stop(self) -> None:
        pids = self.pids(self.status())
        if self.proc is not None:
            self.proc.stop(timeout=45)
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
    except StartError:
        raise  # it names `mtpstack up` and ends with its log tail
    except Exception as e:
        raise RuntimeError(f"{e}\n`mtpstack up` log tail ({stack.log}):\n{tail_text(stack.log, 12)}") from e
    finally:
        stack.stop()


async def _real_steps(session, stack: RealStack, out: dict, *, requests: int, clients: int, n_disconnects: int, kills: int, deadline: float) -> None:
    t0 = time.monotonic()
    await stack.start()
    out["startup_seconds"] = round(time.monotonic() - t0, 1)
    status = await stack.astatus()
    worker_url = status["workers"]["w0"]["url"]
    proxy_pid = status["proxy"]["pid"]
    proxy_log = Path(status["proxy"]["log"])

    # load
    say(f"real load: {requests} requests from {clients} clients")
    w0 = await get_metrics(session, worker_url)
    before = memory_kib(proxy_pid)
    tally = LoadTally()
    targets = {"proxy_inflight{worker=w0}": (stack.url, "mtpstack_proxy_inflight", {"worker": "w0"}),
               "worker_active_sequences": (worker_url, series.ACTIVE_SEQUENCES, {})}
    t0 = time.monotonic()
    with GaugeSampler(session, targets, interval=0.1) as sampler:
        complete = await drive(session, stack.url, requests, clients, real_body, tally, 180.0, deadline)
    seconds = time.monotonic() - t0
    await asyncio.sleep(1.0)
    after = memory_kib(proxy_pid)
    w1 = await get_metrics(session, worker_url)
    full = lambda m: sample(m, series.REJECTED, code="worker_full") or 0.0  # noqa: E731
    out["load"] = {
        "label": "real-gate2", "target": "real", "gate": stack.width, "upstreams": 1, "clients": clients, "max_waiting": 32,
        "capacity": stack.width + 32, "queue_bound_reachable": clients > stack.width + 32,
        "requested": requests, "complete": complete, **tally_dict(tally, seconds),
        "worker_full_rejections": int(full(w1) - full(w0)),
        "sampled_max": {k: sampler.max.get(k) for k in targets}, "samples": sampler.samples,
        "tokens_generated": int((sample(w1, series.TOKENS_GENERATED) or 0) - (sample(w0, series.TOKENS_GENERATED) or 0)),
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
            v = sample(m, series.ACTIVE_SEQUENCES)
            return v == 0, v

        t_idle = time.monotonic()
        idle, active = await settle(session, worker_idle)
        idle_seconds = time.monotonic() - t_idle
        m1 = await get_metrics(session, stack.url)
        wm1 = await get_metrics(session, worker_url)
        tokens = lambda m: sample(m, series.TOKENS_GENERATED) or 0.0  # noqa: E731
        again = await serves_again(session, stack.url, [real_body(i, max_tokens=8) for i in range(2)])
        by_kind = logged_statuses(proxy_log, r.pop("ids"))
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
            await stack.wait_ready(min(180, max(1, deadline - time.monotonic())))
            pid = (await stack.worker())["pid"]

            def kill(pid=pid):
                signal_group(pid, signal.SIGKILL)

            rounds.append(await kill_round(session, stack.url, stack.port, real_body(i, max_tokens=400, stream=True), kill, "w0"))
            end = time.monotonic() + 60
            while (await stack.worker()).get("pid") in (None, pid) and time.monotonic() < end:
                await asyncio.sleep(0.2)
            UP_CHILDREN.extend(stack.pids(await stack.astatus()))
            say(f"real kills: {i + 1} done: {rounds[-1]['outcomes']}")
        back = True
        try:
            await stack.wait_ready(180)
        except StartError:
            back = False
        ok, value = await settle(session, proxy_slots(session, stack.url))
        again = await serves_again(session, stack.url, [real_body(i, max_tokens=8) for i in range(2)]) if back else None
        out["kills"] = {
            "target": "real", "requested": kills, **summarize_rounds(rounds), "slots_after": value, "leaked_after": not ok,
            "restarts": (await stack.worker()).get("restarts"), "serves_again": again,
        }


# -- a worker killed under load, with another to fail over to ---------------------------------------
async def request_outcome(session: aiohttp.ClientSession, url: str, body: dict, rid: str, bound: float) -> str:
    """"ok" (a 200, a stream to its `[DONE]`), or what the client saw instead."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    try:
        async with asyncio.timeout(bound):
            async with session.post(url + path, json=body, headers={"X-Request-Id": rid}) as r:
                if r.status != 200:
                    try:
                        return f"{r.status} {json.loads(await r.read())['error']['code']}"
                    except (ValueError, KeyError, TypeError):
                        return f"{r.status}"
                if not body.get("stream"):
                    await r.read()
                    return "ok"
                error = None
                async for line in r.content:
                    if line.startswith(b"data: [DONE]"):
                        return "ok"
                    if line.startswith(b'data: {"error"'):
                        error = json.loads(line[6:])["error"]["code"]
                return f"stream {error}" if error else "stream cut without an error event"
    except TimeoutError:
        return f"no answer within {bound:g} s"
    except aiohttp.ClientError as e:
        return type(e).__name__


def logged_requests(log: Path, ids) -> dict[str, dict]:
    """The proxy's request line of each of `ids`, with `sent` (to its last worker) and `ended` in
    wall-clock seconds, from its `time` (the end), `duration_ms` and `queue_wait_ms`."""
    wanted, out = set(ids), {}
    for line in log.read_text(errors="replace").splitlines():
        if not (line.startswith("{") and '"request"' in line):
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") != "request" or e.get("request_id") not in wanted:
            continue
        ended = dt.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
        arrived = ended - (e.get("duration_ms") or 0) / 1000
        e.update(ended=ended, sent=arrived + (e.get("queue_wait_ms") or 0) / 1000)
        out[e["request_id"]] = e
    return out


async def _both_healthy(session, stack: RealStack, deadline: float) -> None:
    while time.monotonic() < deadline:
        status, body = await get_json(session, stack.url + "/readyz")
        if all(w.get("healthy") for w in (body or {}).get("workers", {}).values()) and len((body or {}).get("workers", {})) == 2:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the two workers were not both healthy before the deadline")


#: Clients of the failover phase, and the pause each takes between its requests (an agent's tool
#: time, shortened): busy enough to keep both workers serving, idle enough that a worker is
#: sometimes between requests, which is when a request finds it dead before anything else does.
FAILOVER_CLIENTS, FAILOVER_PAUSE = 6, (0.0, 0.4)


async def _w0_inflight(session, stack: RealStack) -> int | None:
    _, body = await get_json(session, stack.url + "/readyz")
    return ((body or {}).get("workers", {}).get("w0") or {}).get("inflight")


async def real_failover(session, workdir: Path, *, kills: int, clients: int, deadline: float) -> dict:
    """Two native workers of one model behind `mtpstack up`'s proxy, `clients` clients each sending
    requests with short pauses (half streamed); `w0` SIGKILLed `kills` times, each once both serve
    again (`mtpstack up` restarts it): in turn while it holds requests (they fail, and mark it
    unhealthy) and while it holds none (the next requests sent to it find it dead: only failover
    keeps them from a 502). Every request's outcome is matched with the proxy's log line."""
    from devkit.demo.tiny import build_tiny_pair

    say(f"real failover: building tiny models, `mtpstack up` with two workers; {kills} SIGKILLs of w0 under load")
    target, drafter = build_tiny_pair(workdir / "failover-models", seed=0)
    stack = RealStack(workdir, target, drafter, workers=2, name="failover")
    outcomes: dict[str, str] = {}
    kill_times: list[float] = []
    kill_kinds: list[str] = []
    stop = asyncio.Event()

    async def client(c: int) -> None:
        rng = random.Random(c)
        i = 0
        while not stop.is_set() and time.monotonic() < deadline:
            rid = f"failover-{c}-{i}"
            outcomes[rid] = await request_outcome(session, stack.url, real_body(c * 100_000 + i, max_tokens=24 + i % 24), rid, HANG_SECONDS)
            i += 1
            await asyncio.sleep(rng.uniform(*FAILOVER_PAUSE))

    try:
        await stack.start()
        proxy_log = Path((await stack.astatus())["proxy"]["log"])
        tasks = [asyncio.create_task(client(c)) for c in range(clients)]
        try:
            for k in range(kills):
                await _both_healthy(session, stack, deadline)
                await asyncio.sleep(1.0)  # both serve the load
                busy = k % 2 == 0  # in turn: while it holds requests, while it holds none
                pid = (await stack.worker("w0"))["pid"]
                end = min(deadline, time.monotonic() + 30)
                while time.monotonic() < end and (((await _w0_inflight(session, stack)) or 0) > 0) != busy:
                    await asyncio.sleep(0.01)
                kill_kinds.append("busy" if busy else "idle")
                kill_times.append(time.time())
                signal_group(pid, signal.SIGKILL)
                end = time.monotonic() + 60
                while (await stack.worker("w0")).get("pid") in (None, pid) and time.monotonic() < end:
                    await asyncio.sleep(0.2)
                UP_CHILDREN.extend(stack.pids(await stack.astatus()))
                say(f"real failover: kill {k + 1} done, {len(outcomes)} requests so far")
            await _both_healthy(session, stack, deadline)
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)  # the last request lines reach the log
        counts = failover_counts(outcomes, logged_requests(proxy_log, outcomes), kill_times, "w0")
    finally:
        stack.stop()
    result = {"target": "real", "requested": kills, "kills": len(kill_times), "kill_kinds": kill_kinds, "clients": clients, **counts}
    say(f"real failover: {result['ok']} ok of {result['requests']}, errors {result['errors']}, failed over {result['failed_over']}")
    return result


# -- main ----------------------------------------------------------------------------------------
QUICK = {"requests": 2000, "bound_requests": 300, "kills": 10, "failovers": 4, "disconnects": 100, "real_requests": 40, "real_disconnects": 20, "real_kills": 1,
         "real_failovers": 1, "deadline": 300}
FULL = {"requests": 20000, "bound_requests": 2000, "kills": 100, "failovers": 20, "disconnects": 1000, "real_requests": 300, "real_disconnects": 200, "real_kills": 5,
        "real_failovers": 5, "deadline": 1100}


#: What `--only` selects: the fake loads, the fake queue bounds, then each phase by its result key.
PHASE_KEYS = ("load", "bound", "fake_kills", "fake_failover", "fake_disconnects", "real", "real_failover")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/scripts/load_bench.py", description="Load and fault figures for the proxy and `mtpstack up`.")
    ap.add_argument("--quick", action="store_true", help="a smoke run of about a minute (smaller counts)")
    ap.add_argument("--out", default="load-bench.json", help="where the raw figures go (default: load-bench.json)")
    ap.add_argument("--skip-real", action="store_true", help="fake upstreams only (no mlx needed)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs, tiny models)")
    ap.add_argument("--only", nargs="+", choices=PHASE_KEYS, help="run only these phases (default: all)")
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
        phases = []  # (name, run it, where its result goes, what `--only` calls it)
        real: dict = {}
        for gate in (2, 4):
            phases.append((f"fake load gate {gate}", lambda g=gate: fake_load(session, workdir, gate=g, requests=args.requests, clients=64, max_waiting=64, deadline=deadline), "load", "load"))
        for gate in (2, 4):
            phases.append((f"fake queue bound gate {gate}", lambda g=gate: fake_load(session, workdir, gate=g, requests=args.bound_requests, clients=64, max_waiting=16, deadline=deadline), "load", "bound"))
        phases.append(("fake kills", lambda: fake_kills(session, workdir, args.kills, deadline), "fake_kills", "fake_kills"))
        phases.append(("fake failover", lambda: fake_failover(session, workdir, args.failovers, deadline), "fake_failover", "fake_failover"))
        phases.append(("fake disconnects", lambda: fake_disconnects(session, workdir, args.disconnects, deadline), "fake_disconnects", "fake_disconnects"))
        if not args.skip_real:
            phases.append(("real stack", lambda: real_phase(session, workdir, real, requests=args.real_requests, clients=16,
                                                             n_disconnects=args.real_disconnects, kills=args.real_kills, deadline=deadline), "real", "real"))
            if args.real_failovers:
                phases.append(("real failover", lambda: real_failover(session, workdir, kills=args.real_failovers, clients=FAILOVER_CLIENTS,
                                                                       deadline=deadline), "real_failover", "real_failover"))
        for name, phase, key, select in phases:
            if args.only and select not in args.only:
                continue
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
        stop_all()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return 130
    finally:
        stop_all()
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
