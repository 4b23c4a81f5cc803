"""The whole stack under load: the parts of `bench/scripts/load_bench.py`'s modes (faults, hostile, proxy, tenant).

- `run_meta`: what a run was (date, command, machine, commit, uncommitted files, load average);
- `fake_process` / `proxy_process`: a scripted upstream (`devkit.fake_fleet.FakeUpstream`) and `mtpstack proxy` on
  loopback, started and waited for (each round's order of the arms: `mtpstack.bench.parts.rotated`);
- `send` / `Answer` / `Tally` / `drive`: one request and what its client saw, counted over many, from
  concurrent client loops; `serves_again`;
- `get_metrics` / `get_json`, `GaugeSampler` (the largest value of some gauges, polled), `settle` and
  `proxy_slots` (a leak is what does not come back to 0), `memory_kib`;
- `request_events`: the proxy's request log lines;
- `span`: samples as `median (min..max)`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from mtpstack.bench.stats import summarize
from mtpstack.proxy.prometheus import parse_samples, sample
from mtpstack.runtime import Process, StartError, url_of

HOST = "127.0.0.1"
#: The checkout: `python -m devkit.fake_upstream` runs from it.
ROOT = Path(__file__).resolve().parents[1]


# -- runs and processes ------------------------------------------------------------------------
def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run_meta(argv: list[str]) -> dict:
    """The run's date, command (`argv`, the script's path first), machine, commit and the tracked files
    changed in the checkout (shared checkouts run what is on disk, not HEAD), and the load average now."""
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(shlex.quote(a) for a in argv), "cpus": os.cpu_count(),
        "platform": platform.platform(terse=True), "python": platform.python_version(),
        "commit": _git("rev-parse", "--short", "HEAD").strip() or "?",
        "modified": [line[3:] for line in _git("status", "--porcelain", "--untracked-files=no").splitlines()],
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


async def _ready(proc: Process, path: str, timeout: float = 60.0) -> Process:
    try:
        await asyncio.to_thread(proc.wait_ready, path, timeout)
    except StartError as e:
        raise SystemExit(f"error: {e}") from None
    return proc


async def fake_process(procs, workdir: Path, name: str, gate: int, *args: str):
    """`devkit.fake_upstream` as `name` on loopback at `gate` (`args`: its pacing), healthy: a `FakeUpstream`."""
    from devkit.fake_fleet import FakeUpstream

    fake = FakeUpstream(name, name, gate, workdir / f"{name}.log", procs, args)
    await _ready(fake.start(), "/health")
    return fake


async def proxy_process(procs, workdir: Path, name: str, config: dict, python: str = sys.executable,
                        extra: tuple[str, ...] = ()) -> Process:
    """`mtpstack proxy` (run by `python`) on `config` (written to `workdir/NAME.json`), its log
    `workdir/NAME.log`, ready."""
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(config))
    proc = procs.start([python, "-m", "mtpstack", "proxy", "--config", str(path), *extra],
                       log_path=workdir / f"{name}.log", name=name, url=url_of(HOST, config["proxy"]["port"]), cwd=ROOT)
    return await _ready(proc, "/readyz")


def request_events(log: Path) -> list[dict]:
    """The proxy's request lines (one JSON object per line, `event` "request"), in order; none without the log."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        if line.startswith("{") and '"request"' in line:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "request":
                out.append(e)
    return out


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


def span(values: list[float], fmt: str = ".0f", scale: float = 1.0, sep: str = "..") -> str:
    """`median (min..max)` of the samples (NaN left out), each times `scale`; `-` for none."""
    v = [x * scale for x in values if x == x]
    if not v:
        return "-"
    s = summarize(v)
    return f"{s.median:{fmt}} ({s.min:{fmt}}{sep}{s.max:{fmt}})"


def count(d: dict, key) -> None:
    d[key] = d.get(key, 0) + 1


# -- one request, and many ----------------------------------------------------------------------
@dataclass
class Answer:
    """What a client saw: a status (None: no answer, `reason` says why), a refusal's or a failed
    stream's error code, how a 200 stream ended (`done`, `error`, `cut`) and the time it took."""

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
    """One request (chat completions for a body with `messages`, else completions); an answer that
    does not come within `bound` is no answer."""
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
    """Answers counted: by status, a refusal by `status code`, 429s by Retry-After (None: without one), the
    unanswered by why, streams by how they ended."""

    sent: int = 0
    statuses: dict = field(default_factory=dict)
    codes: dict = field(default_factory=dict)
    retry_after: dict = field(default_factory=dict)
    unanswered_reasons: dict = field(default_factory=dict)
    streams: dict = field(default_factory=dict)
    latencies: list = field(default_factory=list)

    @property
    def unanswered(self) -> int:
        return sum(self.unanswered_reasons.values())

    def add(self, a: Answer) -> None:
        self.sent += 1
        if a.stream:
            count(self.streams, "started")
        if a.status is None:
            count(self.unanswered_reasons, a.reason)
            return
        count(self.statuses, str(a.status))
        self.latencies.append(a.seconds)
        if a.stream:
            count(self.streams, a.stream)
        elif a.status != 200:
            count(self.codes, f"{a.status} {a.code or '?'}")
            if a.status == 429:
                count(self.retry_after, a.retry_after)

    def figures(self, seconds: float) -> dict:
        lat = sorted(self.latencies)
        pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 1) if lat else None  # noqa: E731
        s = self.streams
        return {
            "sent": self.sent, "answered": self.sent - self.unanswered, "unanswered": self.unanswered,
            "unanswered_reasons": self.unanswered_reasons, "statuses": self.statuses, "error_codes": self.codes,
            "retry_after_missing": self.retry_after.get(None, 0),
            "retry_after_values": {k: n for k, n in self.retry_after.items() if k is not None},
            "streams": s.get("started", 0), "streams_done": s.get("done", 0), "stream_errors": s.get("error", 0),
            "stream_truncated": s.get("cut", 0),
            "seconds": round(seconds, 2), "requests_per_second": round(self.sent / seconds, 1) if seconds else None,
            "latency_ms": {"p50": pick(0.5), "p99": pick(0.99), "max": round(lat[-1] * 1000, 1) if lat else None},
        }


async def drive(session, url: str, n: int, clients: int, make_body, tally: Tally, bound: float, deadline: float,
                start: int = 0) -> bool:
    """`clients` loops sending requests `start`..`n - 1` one after another; False when the deadline cut it short."""
    counter = iter(range(start, n))
    cut = False

    async def client() -> None:
        nonlocal cut
        for i in counter:
            if time.monotonic() > deadline:
                cut = True
                return
            tally.add(await send(session, url, make_body(i), bound))

    await asyncio.gather(*(client() for _ in range(clients)))
    return not cut


async def serves_again(session, url: str, bodies: list[dict], bound: float) -> dict:
    """The `bodies` sent at once: do the slots serve after a fault?"""
    tally = Tally()
    for a in await asyncio.gather(*(send(session, url, b, bound) for b in bodies)):
        tally.add(a)
    return {"sent": tally.sent, "statuses": tally.statuses, "streams_done": tally.streams.get("done", 0),
            "unanswered": tally.unanswered}


# -- what the processes report ---------------------------------------------------------------
async def get_metrics(session: aiohttp.ClientSession, url: str) -> dict:
    """`/metrics`, parsed by `mtpstack.proxy.prometheus`; {} when it does not answer."""
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return parse_samples(await r.text())
    except (aiohttp.ClientError, TimeoutError):
        return {}


async def get_json(session: aiohttp.ClientSession, url: str) -> dict:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.json(content_type=None) or {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}


class GaugeSampler:
    """Polls /metrics of some processes on an interval, keeping the largest value of each series
    asked for. A sample, not a trace: a peak shorter than the interval can be missed."""

    def __init__(self, session, targets: dict[str, tuple[str, str, dict]], interval: float = 0.1):
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

    def figures(self) -> dict:
        return {"sampled_max": {k: self.max.get(k) for k in self.targets}, "samples": self.samples}


async def settle(check, timeout: float) -> tuple[bool, object]:
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
        busy = inflight.get((("worker", worker),), 0) if worker is not None else sum(inflight.values())
        waiting = sum(m.get("mtpstack_proxy_queue_depth", {}).values())
        return busy == 0 and waiting == 0, {"inflight": busy, "queue_depth": waiting}

    return check
