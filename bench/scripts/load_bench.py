"""The whole stack under load, a mode per part of the question (issue 50): no mode, faults through fake upstreams
and `mtpstack up` on tiny models (docs/load-bench.md); `hostile`, hostile input at volume (docs/hardening.md);
`proxy`, the proxy's added latency and CPU, and `tenant`, fair queueing (docs/proxy.md). Every process starts on
loopback and stops at exit; raw figures go to `--out`, the table to stdout; a failed check exits 1.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import itertools
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import aiohttp
import yaml

from devkit.fake_fleet import FakeFleet, FakeUpstream, proxy_before_fake
from devkit.raw_http import RawStream, json_answer
from mtpstack import series
from mtpstack.bench.load import (HOST, Tally, drive, fake_process, get_json, get_metrics, log_events,
                                 memory_kib, proxy_process, proxy_slots, ready, request_events, sampled, send,
                                 serves_again, settle, until)
from mtpstack.bench.parts import loadavg, rotated, rounds, run_meta
from mtpstack.bench.servers import start_workers
from mtpstack.bench.stacks import Sample, cpu_seconds, nginx_program, nginx_version, plain, start_nginx, stream
from mtpstack.bench.stats import percentile
from mtpstack.proxy.prometheus import sample
from mtpstack.runtime import Process, Processes, StartError, free_port, signal_group, tail_text, url_of

from load_report import (CLIENT_SECONDS, FLOOD_PROBE_DELAY, HANG_SECONDS, PROXY_CHUNKS, SETTLE_SECONDS,
                         STALL_IDLE_SECONDS, STALL_SCHEMAS, STALL_WIDTH, TENANT_MODES, checks, failover_counts,
                         flood_answer_kind, hostile_lines, must_be_zero, proxy_lines, proxy_summary, report_lines,
                         tenant_lines)  # beside this script

ROOT = _checkout.ROOT
#: Fake upstream pacing: the proxy is the bottleneck, yet requests overlap inside an upstream.
LOAD_PACING = ["--delay", "0.001", "--chunks", "8", "--interval", "0.001"]
#: A stream long enough to be cut in the middle: 2,000 chunks 5 ms apart (10 s).
LONG_STREAM = {"chunks": 2000, "interval": 0.005}
STREAM_EVERY = 4  # every 4th load request is streamed
#: Every process started here, stopped at exit (Ctrl-C too); and the pids `mtpstack up` started for us.
CHILDREN = Processes()
UP_CHILDREN: list[int] = []


def say(text: str) -> None:
    print(f"load-bench: {text}", file=sys.stderr, flush=True)


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


# == faults: the fake setups ======================================================================
@contextlib.asynccontextmanager
async def fake_setup(workdir: Path, label: str, fakes: list[tuple[str, str, int]], max_waiting: int):
    """Fake upstreams paced for load behind a proxy of their gates, its queue `max_waiting`; stopped on exit."""
    proxy = {"modelConcurrencyLimits": {model: gate for _, model, gate in fakes},
             "queue": {"maxWaiting": max_waiting, "timeoutSeconds": 60.0},
             "timeouts": {"connectSeconds": 5, "firstByteSeconds": 60, "idleSeconds": 30}, "shutdownGraceSeconds": 2}
    setup = FakeFleet(workdir / label, fakes, proxy, fake_args=LOAD_PACING, processes=CHILDREN)
    try:
        await asyncio.to_thread(setup.start)
        yield setup
    finally:
        setup.stop()


async def upstream_stats(session, setup: FakeFleet) -> dict[str, dict]:
    return {f.name: await get_json(session, f.url + "/stats") for f in setup.fakes}


async def measured_load(session, row: dict, url: str, pid: int, targets: dict, n: int, make_body, bound: float,
                        deadline: float, halves: bool = False) -> dict:
    """`n` requests, `targets` sampled meanwhile; the proxy's RSS before, after (and between halves: growth once or
    steady)."""
    clients, capacity = row["clients"], row["gate"] * row["upstreams"] + row["max_waiting"]
    tally, rss = Tally(), {"before": memory_kib(pid).get("VmRSS")}
    t0, half = time.monotonic(), n // 2 if halves else n
    async with sampled(session, targets) as sampler:
        complete = await drive(session, url, half, clients, make_body, tally, bound, deadline)
        if halves:
            rss["half"] = memory_kib(pid).get("VmRSS")
            complete &= await drive(session, url, n, clients, make_body, tally, bound, deadline, start=half)
    seconds = time.monotonic() - t0
    await asyncio.sleep(1.0)
    after = memory_kib(pid)
    rss.update(after=after.get("VmRSS"), peak=after.get("VmHWM"))
    return {**row, "capacity": capacity, "queue_bound_reachable": clients > capacity, "requested": n,
            "complete": complete, **tally.figures(seconds), **sampler, "proxy_rss_kib": rss}


def request(model: str, text: str, chat: bool, **fields) -> dict:
    said = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    return {"model": model, **said, **fields}


def fake_body(i: int) -> dict:
    """Every 4th streamed; chat and completions in turn, 4 at a time."""
    return request("fake", f"hello {i}", (i // STREAM_EVERY) % 2 == 1, max_tokens=8,
                   stream=i % STREAM_EVERY == STREAM_EVERY - 1)


async def fake_load(session, workdir: Path, *, gate: int, requests: int, max_waiting: int, deadline: float) -> dict:
    label = f"fake-gate{gate}-waiting{max_waiting}"
    async with fake_setup(workdir, label, [(f"u{i}", "fake", gate) for i in range(2)], max_waiting) as setup:
        targets = {f"inflight{{worker={f.name}}}": (setup.url, "mtpstack_proxy_inflight", {"worker": f.name})
                   for f in setup.fakes}
        targets["queue_depth{model=fake}"] = (setup.url, "mtpstack_proxy_queue_depth", {"model": "fake"})
        row = {"label": label, "target": "fake", "gate": gate, "upstreams": 2, "clients": 64,
               "max_waiting": max_waiting}
        load = await measured_load(session, row, setup.url, setup.proxy.pid, targets, requests, fake_body, 90.0,
                                   deadline, halves=True)
        stats = await upstream_stats(session, setup)
        m = await get_metrics(session, setup.url)
    result = {**load, "upstream_max_concurrency": {k: v.get("max_active") for k, v in stats.items()},
              "upstream_violations": sum(v.get("violations", 0) for v in stats.values()),
              "upstream_served": {k: v.get("served") for k, v in stats.items()},
              "inflight_after": sum((m.get("mtpstack_proxy_inflight") or {}).values())}
    say(f"{label}: {result['statuses']} in {result['seconds']:.1f} s, "
        f"upstream max concurrency {result['upstream_max_concurrency']}")
    return result


# == faults: kills, by raw streams (`devkit.raw_http.RawStream`) ===================================
async def kill_round(session, proxy_url: str, proxy_port: int, bodies: list[dict], kill, worker: str | None,
                     then=None) -> dict:
    """A stream of each of `bodies` (a third queues behind a gate of 2); once two have a chunk, `kill()`. Each client
    must then see its stream end (or an error status) within HANG_SECONDS; `then()` runs before the proxy's slots
    (of `worker`, or all) must settle."""
    opened = []
    try:
        for body in bodies:
            opened.append(await RawStream.open(HOST, proxy_port, body))
            await asyncio.sleep(0.02)  # arrival order: the third one queues behind the gate

        async def first_chunk(s: RawStream) -> bool:
            return await s.headers() == 200 and await s.until_events(1)

        firsts = [asyncio.ensure_future(first_chunk(s)) for s in opened]
        have = lambda: sum(t.done() and not t.exception() and t.result() for t in firsts)  # noqa: E731
        deadline = time.monotonic() + HANG_SECONDS
        while have() < 2 and time.monotonic() < deadline:
            await asyncio.wait(firsts, timeout=0.05)
        admitted = have()
        kill()
        outcomes = []
        for s, t in zip(opened, firsts):
            try:
                async with asyncio.timeout(HANG_SECONDS):
                    await asyncio.wait([t])  # its first chunk, its error status, or its end
                    outcomes.append(await s.outcome())
            except TimeoutError:
                outcomes.append("hung")
            except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
                outcomes.append("connection_closed")
        for t in firsts:
            t.cancel()
    finally:
        for s in opened:
            s.close()
    if then is not None:
        await then()
    ok, value = await settle(proxy_slots(session, proxy_url, worker), SETTLE_SECONDS)
    return {"admitted_before_kill": admitted, "outcomes": outcomes, "slot_leaked": not ok, "after": value}


async def rounds_summary(session, proxy_url: str, kills: list[dict], requested: int) -> dict:
    ok, value = await settle(proxy_slots(session, proxy_url), SETTLE_SECONDS)
    outcomes = Counter(o for r in kills for o in r["outcomes"])
    return {
        "requested": requested, "kills": len(kills), "clients": sum(len(r["outcomes"]) for r in kills),
        "hung": outcomes["hung"], "rounds_with_leaked_slot": sum(r["slot_leaked"] for r in kills),
        "admitted_streams_cut_without_error_event": outcomes["cut"], "outcomes": dict(outcomes),
        "kills_with_fewer_than_2_streams_started": sum(r["admitted_before_kill"] < 2 for r in kills),
        "slots_after": value, "leaked_after": not ok,
    }


def restart(f: FakeUpstream):
    def kill() -> None:
        f.kill()
        f.start()  # back in the background; the proxy's health check picks it up

    return kill


async def healthy(session, proxy_url: str, names, timeout: float, fakes: tuple[FakeUpstream, ...] = ()) -> bool:
    """Whether `/readyz` calls each of `names` healthy within `timeout`, restarting any of `fakes` not running."""
    async def check():
        for f in fakes:
            if not f.process.alive():
                f.start()
        workers = (await get_json(session, proxy_url + "/readyz")).get("workers", {})
        return all(workers.get(name, {}).get("healthy") for name in names), None

    return (await settle(check, timeout, interval=0.05))[0]


async def fake_kills(session, workdir: Path, kills: int, deadline: float) -> dict:
    """SIGKILL fake upstreams mid-stream, round robin over 4 models of one upstream each, and restart them."""
    async with fake_setup(workdir, "fake-kills", [(f"k{i}", f"m{i}", 2) for i in range(4)], 8) as setup:
        done: list[dict] = []
        for i in until(kills, deadline):
            f = setup.fakes[i % len(setup.fakes)]
            await healthy(session, setup.url, [f.name], min(60, deadline - time.monotonic()), (f,))
            body = {"model": f.model, "prompt": "long", "stream": True, "x_fake": LONG_STREAM}
            done.append(await kill_round(session, setup.url, setup.port, [body] * 3, restart(f), f.name))
        result = {"target": "fake", **await rounds_summary(session, setup.url, done, kills)}
    say(f"fake kills: {result['outcomes']}, leaked after: {result['slots_after']}")
    return result


async def fake_failover(session, workdir: Path, n: int, deadline: float) -> dict:
    """A model on two upstreams, a stream on each, the first SIGKILLed mid-stream: the other stream must finish,
    and once the dead one's has its error event (it is marked unhealthy), the survivor answers new requests."""
    after = Tally()

    async def then() -> None:  # requests right after each kill, counted in `after`
        await serves_again(session, setup.url, [{"model": "mm", "prompt": "x"}] * 4, HANG_SECONDS, after)

    async with fake_setup(workdir, "fake-failover", [("f0", "mm", 2), ("f1", "mm", 2)], 8) as setup:
        done: list[dict] = []
        for i in until(n, deadline):
            await healthy(session, setup.url, ["f0", "f1"], min(60, deadline - time.monotonic()), tuple(setup.fakes))
            # one stream on each (config order, then least loaded), each its own prompt against cache-aware routing
            bodies = [{"model": "mm", "prompt": f"long {i}.{k}", "stream": True,
                       "x_fake": {"chunks": 200, "interval": 0.005}} for k in range(2)]
            done.append(await kill_round(session, setup.url, setup.port, bodies, restart(setup.fakes[0]), None, then))
        result = {"target": "fake", **await rounds_summary(session, setup.url, done, n),
                  "requests_after_failure": after.counts()}
    say(f"fake failover: {result['outcomes']}, requests after: {dict(after.statuses)}")
    return result


# == faults: client disconnects =====================================================================
async def disconnect_phase(session, url: str, port: int, log: Path, models: list[str], n: int, clients: int, body_for,
                           deadline: float, idle, again: list[dict]) -> dict:
    """`n` requests closed early from `clients` loops, half by FIN, half by RST: 6 in 8 streams after 1-3 chunks
    (`mid-stream`), 1 in 8 streams 20-80 ms after sending without reading (`early`), 1 in 8 non-streamed requests
    20-80 ms after sending (`plain`). Then the proxy's slots settled, the upstream idle (`idle`, a settle check whose
    value is stored), the status the proxy logged for each, its 499 counter, and `again` served."""
    rng = random.Random(7)
    ids: dict[str, str] = {}  # X-Request-Id -> how the client left, to find each one in the proxy's log
    counter = until(n, deadline)

    async def leave() -> None:
        for i in counter:
            model, how = models[i % len(models)], "rst" if (i // 8) % 2 else "fin"
            early = {3: "early", 7: "plain"}.get(i % 8)
            s, rid = None, f"load-bench-{os.getpid()}-{i}"
            try:
                async with asyncio.timeout(HANG_SECONDS):
                    s = await RawStream.open(HOST, port, body_for(model, early != "plain"), rid)
                    if early:
                        await asyncio.sleep(rng.uniform(0.02, 0.08))
                        kind = f"{early}/{how}"
                    elif (status := await s.headers()) != 200:
                        kind = f"status_{status}"
                    else:
                        kind = f"mid-stream/{how}" if await s.until_events(rng.randint(1, 3)) else "ended_early"
            except TimeoutError:
                kind = "hung"
            except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
                kind = "connection_error"
            finally:
                if s is not None:
                    s.close(how)
            ids[rid] = kind

    m0 = await get_metrics(session, url)
    await asyncio.gather(*(leave() for _ in range(clients)))
    ok, value = await settle(proxy_slots(session, url), SETTLE_SECONDS)
    # the proxy frees its slot before it closes the upstream connection: the upstream idles a moment later
    t_idle = time.monotonic()
    _, idle_value = await settle(idle, SETTLE_SECONDS)
    idle_seconds = round(time.monotonic() - t_idle, 2)
    m1 = await get_metrics(session, url)
    served = await serves_again(session, url, again, HANG_SECONDS)
    seen = {e["request_id"]: e.get("status") for e in request_events(log) if e.get("request_id") in ids}
    by_kind: dict[str, Counter] = {}
    for rid, kind in ids.items():
        by_kind.setdefault(kind, Counter())[str(seen.get(rid, "not logged"))] += 1
    total_499 = lambda m: sum(v for k, v in m.get("mtpstack_proxy_requests_total", {}).items()  # noqa: E731
                              if ("status", "499") in k)
    kinds = Counter(ids.values())
    say(f"disconnects: {dict(kinds)}, slots after {value}, then {idle_value}")
    return {"disconnects": len(ids), "kinds": dict(kinds), "hung": kinds["hung"],
            "connection_errors": kinds["connection_error"], "requested": n, "slots_after": value,
            "leaked_after": not ok, "proxy_logged": dict(sum(by_kind.values(), Counter())),
            "proxy_logged_by_kind": {k: dict(c) for k, c in by_kind.items()},
            "proxy_499": int(total_499(m1) - total_499(m0)), "serves_again": served, **idle_value,
            "idle_after_seconds": idle_seconds}


async def fake_disconnects(session, workdir: Path, n: int, deadline: float) -> dict:
    async with fake_setup(workdir, "fake-disconnects", [(f"d{i}", f"m{i}", 2) for i in range(4)], 16) as setup:
        models = [f.model for f in setup.fakes]

        async def upstreams_idle():
            stats = await upstream_stats(session, setup)
            return all(v.get("active") == 0 for v in stats.values()), {
                "upstream_active_after": {k: v.get("active") for k, v in stats.items()},
                **{f"upstream_{k}": sum(v.get(k, 0) for v in stats.values()) for k in ("cancelled", "violations")}}

        return {"target": "fake", **await disconnect_phase(
            session, setup.url, setup.port, setup.log, models, n, 16,
            # a plain answer takes 0.5 s, so a client leaving after 20-80 ms leaves before it
            lambda model, stream: {"model": model, "prompt": "long", "stream": stream,
                                   "x_fake": LONG_STREAM if stream else {"delay": 0.5}},
            deadline, upstreams_idle, [{"model": m, "prompt": "x", "stream": True} for m in models for _ in range(2)])}


# == faults: the real stack ========================================================================
class RealStack:
    """`mtpstack up` on tiny models, workers `w0`, `w1`... of width and gate 2, read through `mtpstack status`."""

    def __init__(self, workdir: Path, target: Path, drafter: Path, workers: int, name: str, width: int = 2):
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port, self.width = free_port(), width
        worker = {"model": "tiny", "target": {"path": str(target), "bits": "fp32"},
                  "drafter": {"path": str(drafter), "bits": "fp32", "depth": 3}, "maxNumSeqs": width, "host": HOST}
        config = {
            "proxy": {"host": HOST, "port": self.port, "modelConcurrencyLimits": {"tiny": width},
                      "queue": {"maxWaiting": 32, "timeoutSeconds": 120}, "shutdownGraceSeconds": 2},
            "workers": {f"w{i}": {**worker, "port": free_port()} for i in range(workers)},
        }
        self.config_path = self.dir / "fleet.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.run_dir, self.url, self.log = self.dir / "run", url_of(HOST, self.port), self.dir / "up.log"
        self.proc: Process | None = None

    async def status(self) -> dict:
        """`mtpstack status`'s document (in a thread: it asks over HTTP); {} before the run directory exists."""
        from mtpstack.status import StatusError, collect

        try:
            return await asyncio.to_thread(collect, self.run_dir)
        except StatusError:
            return {}

    def pids(self, status: dict) -> list[int]:
        workers = status.get("workers", {}).values()
        return [p for p in [status.get("proxy", {}).get("pid"), *(w.get("pid") for w in workers)] if p]

    async def worker(self, name: str = "w0") -> dict:
        return (await self.status()).get("workers", {}).get(name, {})

    async def restarted(self, name: str, pid: int) -> None:
        """Until `mtpstack up` has restarted the worker `pid` was (up to 60 s)."""
        end = time.monotonic() + 60
        while (await self.worker(name)).get("pid") in (None, pid) and time.monotonic() < end:
            await asyncio.sleep(0.2)
        UP_CHILDREN.extend(self.pids(await self.status()))

    async def wait_ready(self, timeout: float) -> None:
        """Until the proxy is ready; `runtime.StartError` when `mtpstack up` exits first or `timeout` passes."""
        await asyncio.to_thread(self.proc.wait_ready, "/readyz", timeout)

    async def start(self) -> None:
        argv = [sys.executable, "-m", "mtpstack", "up", str(self.config_path), "--run-dir", str(self.run_dir),
                "--health-timeout", "180"]
        t0 = time.monotonic()
        self.proc = CHILDREN.start(argv, log_path=self.log, name="mtpstack up", kind="stack", url=self.url, cwd=ROOT)
        await self.wait_ready(240)
        self.startup_seconds = round(time.monotonic() - t0, 1)
        UP_CHILDREN.extend(self.pids(await self.status()))

    async def stop(self) -> None:
        pids = self.pids(await self.status())
        if self.proc is not None:
            self.proc.stop(timeout=45)
        for pid in pids:
            kill_if_ours(pid)  # only if `mtpstack up` left one behind


@contextlib.asynccontextmanager
async def real_stack(workdir: Path, name: str, workers: int = 1):
    """A `RealStack` on tiny models built for it, started, stopped on exit; an error ends with `mtpstack up`'s log."""
    from devkit.demo.tiny import build_tiny_pair

    target, drafter = build_tiny_pair(workdir / f"{name}-models", seed=0)
    stack = RealStack(workdir, target, drafter, workers, name)
    try:
        await stack.start()
        yield stack
    except StartError:
        raise  # it names `mtpstack up` and ends with its log tail
    except Exception as e:
        raise RuntimeError(f"{e}\n`mtpstack up` log tail ({stack.log}):\n{tail_text(stack.log, 12)}") from e
    finally:
        await stack.stop()


def real_body(i: int, model: str = "tiny", max_tokens: int | None = None, stream: bool | None = None) -> dict:
    rng = random.Random(i)
    stream = rng.random() < 0.5 if stream is None else stream
    return request(model, f"Write a function number {i}." if i % 2 else f"def f{i}(x):\n", i % 2 == 1,
                   max_tokens=max_tokens or rng.randint(8, 32), temperature=0, stream=stream)


async def real_phase(session, workdir: Path, result: dict, *, requests: int, disconnects: int, kills: int,
                     deadline: float) -> None:
    """Load, disconnects and kills on one stack, each stored in `result` as it ends: a failure keeps what finished."""
    async with real_stack(workdir, "real") as stack:
        result["real_startup_seconds"] = stack.startup_seconds
        status = await stack.status()
        worker_url = status["workers"]["w0"]["url"]
        w0 = await get_metrics(session, worker_url)
        targets = {"proxy_inflight{worker=w0}": (stack.url, "mtpstack_proxy_inflight", {"worker": "w0"}),
                   "worker_active_sequences": (worker_url, series.ACTIVE_SEQUENCES, {})}
        row = {"label": "real-gate2", "target": "real", "gate": stack.width, "upstreams": 1, "clients": 16,
               "max_waiting": 32}
        load = await measured_load(session, row, stack.url, status["proxy"]["pid"], targets, requests, real_body,
                                   180.0, deadline)
        w1 = await get_metrics(session, worker_url)
        moved = lambda name, **kw: int((sample(w1, name, **kw) or 0) - (sample(w0, name, **kw) or 0))  # noqa: E731
        result["load"].append({**load, "worker_full_rejections": moved(series.REJECTED, code="worker_full"),
                               "tokens_generated": moved(series.TOKENS_GENERATED)})
        say(f"real load: {load['statuses']} in {load['seconds']:.1f} s, sampled max {load['sampled_max']}")
        if disconnects:
            log = Path(status["proxy"]["log"])
            result["real_disconnects"] = await real_disconnects(session, stack, worker_url, log, disconnects, deadline)
        if kills:
            result["real_kills"] = await real_kills(session, stack, kills, deadline)


async def real_disconnects(session, stack: RealStack, worker_url: str, proxy_log: Path, n: int,
                           deadline: float) -> dict:
    tokens = lambda m: sample(m, series.TOKENS_GENERATED) or 0.0  # noqa: E731
    wm0 = await get_metrics(session, worker_url)

    async def worker_idle():
        v = sample(await get_metrics(session, worker_url), series.ACTIVE_SEQUENCES)
        return v == 0, {"worker_active_sequences_after": v, "worker_leaked_after": v != 0}

    r = await disconnect_phase(session, stack.url, stack.port, proxy_log, ["tiny"], n, 4,
                               lambda model, stream: real_body(0, model, max_tokens=400, stream=stream), deadline,
                               worker_idle, [real_body(i, max_tokens=8) for i in range(2)])
    # each stream asked for 400 tokens: a worker that ignored the disconnects would generate them all
    generated = int(tokens(await get_metrics(session, worker_url)) - tokens(wm0))
    return {"target": "real", **r, "tokens_generated": generated,
            "tokens_if_never_stopped": 400 * r["disconnects"]}


async def real_kills(session, stack: RealStack, kills: int, deadline: float) -> dict:
    done = []
    for i in until(kills, deadline):
        await stack.wait_ready(min(180, max(1, deadline - time.monotonic())))
        pid = (await stack.worker())["pid"]
        kill = lambda pid=pid: signal_group(pid, signal.SIGKILL)  # noqa: E731
        done.append(await kill_round(session, stack.url, stack.port, [real_body(i, max_tokens=400, stream=True)] * 3,
                                     kill, "w0"))
        await stack.restarted("w0", pid)
    back = False
    with contextlib.suppress(StartError):
        await stack.wait_ready(180)
        back = True
    summary = await rounds_summary(session, stack.url, done, kills)
    bodies = [real_body(i, max_tokens=8) for i in range(2)]
    again = await serves_again(session, stack.url, bodies, HANG_SECONDS) if back else None
    return {"target": "real", **summary, "restarts": (await stack.worker()).get("restarts"), "serves_again": again}


# == faults: a worker killed under load, with another to fail over to =============================
def logged_requests(log: Path, ids) -> dict[str, dict]:
    """The proxy's request line of each of `ids`, with when it was `sent` to its last worker and `ended`."""
    out = {}
    for e in request_events(log):
        if e.get("request_id") in ids:
            ended = dt.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
            arrived = ended - (e.get("duration_ms") or 0) / 1000
            out[e["request_id"]] = {**e, "ended": ended, "sent": arrived + (e.get("queue_wait_ms") or 0) / 1000}
    return out


#: The failover phase's clients and their pause (a short tool time): both workers busy, yet sometimes idle.
FAILOVER_CLIENTS, FAILOVER_PAUSE = 6, (0.0, 0.4)


async def real_failover(session, workdir: Path, *, kills: int, clients: int, deadline: float) -> dict:
    """Two workers of one model under `mtpstack up`, `clients` clients sending with short pauses; `w0` SIGKILLed
    `kills` times once both serve, in turn while it holds requests (they fail, and mark it unhealthy) and while it
    holds none (the next ones find it dead: only failover keeps them from a 502). Outcomes matched with the log."""
    outcomes: dict[str, str] = {}
    kill_times: list[float] = []
    kill_kinds = ["busy" if k % 2 == 0 else "idle" for k in range(kills)]
    stop = asyncio.Event()

    async def client(c: int) -> None:
        rng, i = random.Random(c), 0
        while not stop.is_set() and time.monotonic() < deadline:
            rid = f"failover-{c}-{i}"
            body = real_body(c * 100_000 + i, max_tokens=24 + i % 24)
            outcomes[rid] = (await send(session, stack.url, body, HANG_SECONDS, rid)).outcome()
            i += 1
            await asyncio.sleep(rng.uniform(*FAILOVER_PAUSE))

    async def both_serve() -> None:
        if not await healthy(session, stack.url, ("w0", "w1"), deadline - time.monotonic()):
            raise RuntimeError("the two workers were not both healthy before the deadline")
        await asyncio.sleep(1.0)  # both serve the load

    w0_inflight = lambda body: ((body.get("workers", {}).get("w0") or {}).get("inflight") or 0)  # noqa: E731
    async with real_stack(workdir, "failover", workers=2) as stack:
        proxy_log = Path((await stack.status())["proxy"]["log"])
        tasks = [asyncio.create_task(client(c)) for c in range(clients)]
        try:
            for kind in kill_kinds:
                await both_serve()
                # SIGKILL w0 as soon as it holds requests (`busy`) or none, waiting up to 30 s for that
                pid, end = (await stack.worker("w0"))["pid"], min(deadline, time.monotonic() + 30)
                while time.monotonic() < end and (w0_inflight(await get_json(session, stack.url + "/readyz")) > 0) \
                        != (kind == "busy"):
                    await asyncio.sleep(0.01)
                kill_times.append(time.time())
                signal_group(pid, signal.SIGKILL)
                await stack.restarted("w0", pid)
            await both_serve()
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)  # the last request lines reach the log
        counts = failover_counts(outcomes, logged_requests(proxy_log, outcomes), kill_times, "w0")
    result = {"target": "real", "requested": kills, "kills": len(kill_times),
              "kill_kinds": kill_kinds[:len(kill_times)], "clients": clients, **counts}
    say(f"real failover: {result['ok']} ok of {result['requests']}, errors {result['errors']}, "
        f"failed over {result['failed_over']}")
    return result


# == faults: the run ================================================================================
QUICK = {"requests": 2000, "bound_requests": 300, "kills": 10, "failovers": 4, "disconnects": 100, "real_requests": 40,
         "real_disconnects": 20, "real_kills": 1, "real_failovers": 1, "deadline": 300}
FULL = {"requests": 20000, "bound_requests": 2000, "kills": 100, "failovers": 20, "disconnects": 1000,
        "real_requests": 300, "real_disconnects": 200, "real_kills": 5, "real_failovers": 5, "deadline": 1100}
#: What `--only` selects: the fake loads, the fake queue bounds, then each phase by its result key.
PHASE_KEYS = ("load", "bound", "fake_kills", "fake_failover", "fake_disconnects", "real", "real_failover")


async def faults(args: argparse.Namespace, workdir: Path) -> tuple[dict, bool]:
    for key in FULL:
        if getattr(args, key) is None:
            setattr(args, key, (QUICK if args.quick else FULL)[key])
    deadline = time.monotonic() + args.deadline
    result: dict = {"load": [], "errors": []}
    connector, timeout = aiohttp.TCPConnector(limit=0), aiohttp.ClientTimeout(total=None)
    session = aiohttp.ClientSession(connector=connector, timeout=timeout)
    # (name, its `--only` key and the key of its figures, run it) of each phase, in order
    phases = [(f"fake {what} gate {gate}", key, partial(fake_load, session, workdir, gate=gate, requests=n,
                                                        max_waiting=waiting, deadline=deadline))
              for key, what, n, waiting in (("load", "load", args.requests, 64),
                                            ("bound", "queue bound", args.bound_requests, 16)) for gate in (2, 4)]
    phases += [(key.replace("_", " "), key, partial(run, session, workdir, n, deadline)) for key, run, n in (
        ("fake_kills", fake_kills, args.kills), ("fake_failover", fake_failover, args.failovers),
        ("fake_disconnects", fake_disconnects, args.disconnects))]
    if not args.skip_real:  # the real phase stores its figures itself, as each part ends
        phases.append(("real stack", "real", partial(real_phase, session, workdir, result, requests=args.real_requests,
                                                     disconnects=args.real_disconnects, kills=args.real_kills,
                                                     deadline=deadline)))
        if args.real_failovers:
            phases.append(("real failover", "real_failover", partial(real_failover, session, workdir,
                           kills=args.real_failovers, clients=FAILOVER_CLIENTS, deadline=deadline)))
    async with session:
        for name, key, phase in phases:
            if args.only and key not in args.only:
                continue
            if time.monotonic() > deadline:
                result["errors"].append(f"{name}: not started, the run's deadline of {args.deadline} s passed")
                continue
            say(f"{name}: started")
            try:
                r = await phase()
            except Exception as e:  # noqa: BLE001 - one failed phase must not hide the others' figures
                say(f"{name} failed: {type(e).__name__}: {e}")
                result["errors"].append(f"{name}: {type(e).__name__}: {e}")
                continue
            if key in ("load", "bound"):
                result["load"].append(r)
            elif r is not None:
                result[key] = r
    result["meta"] = {"settings": {k: getattr(args, k) for k in FULL}}
    return result, all(passed for passed, _ in checks(result)) and not result["errors"]


# == hostile: input at volume =======================================================================
#: A request unanswered this long is a hang (the demo worker answers a 2-token request in ~0.1 s).
HOSTILE_HANG = 30.0
#: Paths and methods no route serves: each must be answered in OpenAI's error shape.
UNROUTED = [("GET", "/nope"), ("POST", "/v1/embeddings"), ("GET", "/v1/chat/completions"), ("DELETE", "/v1/responses"),
            ("PUT", "/health"), ("GET", "/v1/chat/completions/../../etc/passwd")]
#: "Another client" of the flood comes from a second loopback address (a worker tells clients apart by address).
OTHER_CLIENT = "127.0.0.2"
#: A schema the worker compiled before the flood (the cached fast path).
WARM_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
JSON = {"Content-Type": "application/json"}
HOSTILE_PHASES = ("validate", "proxy", "worker", "agent", "flood")
#: The hostile phases' sizes, each an integer option: its default and what it counts.
HOSTILE_COUNTS = {
    "configs": (10_000, "random fleet configs the validator judges"),
    "requests": (2_000, "malformed requests to each of proxy and worker"),
    "slow": (200, "slow clients, all at once, against the proxy"),
    "agent": (600, "hostile agent-surface requests to each of proxy and worker"),
    "cut": (40, "agent streams the client leaves mid-way"),
    "stall-repeats": (5, "repeats of the idle/loaded stall measurement"),
    "flood": (120, "hostile schemas sent at once in the grammar flood"),
    "flood-repeats": (5, "repeats of the grammar flood"),
}


def counted(n: int, one, **zeros: int) -> dict:
    """`one(i)` for `n` cases in turn, what each returns counted (a name: that count; an int: that status), timed."""
    counts, statuses = Counter(zeros), Counter()
    started_at = time.monotonic()
    for i in range(n):
        for key in one(i):
            (statuses if isinstance(key, int) else counts)[key] += 1
    return {**counts, "statuses": dict(sorted(statuses.items())), "seconds": round(time.monotonic() - started_at, 1)}


def run_validate(tmp: Path, args: argparse.Namespace) -> dict:
    """Generated fleet configs through `mtpstack validate --format json`: its exit codes, and what must not be."""
    from devkit.hostile import random_config
    from mtpstack.cli import main

    def one(i: int) -> list[str]:
        suffix, content = random_config(random.Random(args.seed * 1_000_003 + i))
        path = tmp / f"fleet{suffix}"
        path.write_bytes(content)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = main(["validate", str(path), "--format", "json"])
        except Exception:
            return ["tracebacks"]
        try:
            json.loads(out.getvalue())
            got = []
        except ValueError:
            got = ["no_json"]
        return got + (["internal_errors"] if code == 3 else [f"exit_{code}"] if code in (0, 1, 2) else [])

    return counted(args.configs, one, configs=args.configs, exit_0=0, exit_1=0, exit_2=0, tracebacks=0,
                   internal_errors=0, no_json=0)


def malformed(port: int, n: int, seed: int, model: str, alive) -> dict:
    """`n` malformed requests (bytes, or a bad body) on fresh connections, one at a time."""
    from devkit.hostile import random_body, random_http
    from devkit.raw_http import raw_exchange, request_bytes

    rng = random.Random(seed)

    def one(_: int) -> list:
        path = rng.choice(["/v1/completions", "/v1/chat/completions"])
        data = random_http(rng, path, model) if rng.random() < 0.5 else request_bytes(path, random_body(rng, model))
        got = raw_exchange(HOST, port, data, timeout=HOSTILE_HANG)
        if got.timed_out:
            return ["hangs"]
        return ["closed_without_answer"] if got.status is None else ["answered", got.status, f"{got.status // 100}xx"]

    out = counted(n, one, requests=n, answered=0, closed_without_answer=0, **{"4xx": 0, "2xx": 0, "5xx": 0}, hangs=0)
    return {**out, "crashed": int(not alive())}


def slow(port: int, n: int) -> dict:
    from devkit.raw_http import SLOW_KINDS, slow_client

    started_at = time.monotonic()
    with ThreadPoolExecutor(max_workers=n) as pool:
        kinds = [SLOW_KINDS[i % len(SLOW_KINDS)] for i in range(n)]
        results = list(pool.map(lambda k: slow_client(HOST, port, k, 0.1, CLIENT_SECONDS + HOSTILE_HANG), kinds))
    held = sorted(r.seconds for r in results)
    return {
        "slow_clients": n, "hangs": sum(r.timed_out for r in results),
        "answered_408": sum(r.status == 408 for r in results),
        "closed": sum(r.status is None and not r.timed_out for r in results),
        "5xx": sum(1 for r in results if r.status is not None and r.status >= 500),
        "held_seconds_median": round(held[len(held) // 2], 2), "held_seconds_max": round(held[-1], 2),
        "seconds": round(time.monotonic() - started_at, 1),
    }


def unrouted(url: str) -> int:
    """How many requests to paths and methods no route serves were answered other than in OpenAI's error shape."""
    wrong = 0
    for method, path in UNROUTED:
        try:
            body = b"{}" if method in ("POST", "PUT") else None
            status, _, payload = json_answer(url + path, method, body=body, timeout=10)
            wrong += not (status in (404, 405) and isinstance(payload, dict) and payload["error"]["code"])
        except (ValueError, KeyError, TypeError, OSError):
            wrong += 1
    return wrong


def agent_requests(url: str, n: int, seed: int, model: str) -> dict:
    """Hostile agent requests, a third on `/v1/messages`: statuses, refusals not in their API's shape or unnamed."""
    from devkit.hostile import anthropic_refusal_names_a_field, random_agent_request, random_messages_request

    rng = random.Random(seed)

    def one(i: int) -> list:
        anthropic = i % 3 == 2  # one in three on Anthropic's Messages API, whose refusals take its own shape
        path, body = random_messages_request(rng, model) if anthropic else random_agent_request(rng, model)
        got = ["messages"] if anthropic else []
        try:
            status, _, payload = json_answer(url + path, "POST", JSON, body, timeout=HOSTILE_HANG)
        except ValueError:
            return [*got, "not_json"]
        except OSError:  # a timeout, or the connection dropped
            return [*got, "hangs"]
        if anthropic:
            named = anthropic_refusal_names_a_field(payload)
        else:
            named = isinstance(payload, dict) and (payload.get("error") or {}).get("param")
        return [*got, status, *["5xx"] * (status >= 500), *["unnamed_400"] * (status == 400 and not named)]

    return counted(n, one, requests=n, messages=0, **{"5xx": 0}, hangs=0, not_json=0, unnamed_400=0)


def run_proxy(tmp: Path, args: argparse.Namespace) -> dict:
    with proxy_before_fake(tmp, CLIENT_SECONDS) as running:
        proc, port, log = running.proxy, running.port, running.log
        out = {"malformed": malformed(port, args.requests, args.seed, "m", proc.alive), "slow": slow(port, args.slow),
               "agent": agent_requests(running.url, args.agent, args.seed, "m"),
               "unrouted_not_json": unrouted(running.url)}
        time.sleep(0.5)
        readyz = json_answer(f"{running.url}/readyz", timeout=10)[2]
        out["leaked_slots"] = (sum(w["inflight"] for w in readyz["workers"].values())
                               + sum(m["waiting"] for m in readyz["models"].values()))
        out["crashed"] = int(not proc.alive())
    lines, events = log_events(log)
    out["log"] = {"lines": len(lines), "not_one_json_object": len(lines) - len(events),
                  "with_traceback_field": sum("Traceback" in line for line in lines),
                  "internal_errors": sum(e.get("code") == "internal_error" for e in events),
                  "logged_5xx": sum(e.get("event") == "request" and e.get("status", 0) >= 500 for e in events)}
    return out


@contextlib.contextmanager
def hostile_worker(target: Path, drafter: Path, log: Path, python: str = sys.executable, width: int = 2):
    """`mtpstack worker` on this pair (run by `python`: another checkout's, to compare), `width` slots, served as
    `tiny`, healthy, logging to `log`; stopped on exit. It runs in `log`'s folder: from the checkout, `-m mtpstack`
    would import this checkout's package before the other Python's own."""
    port, procs = free_port(), Processes()
    argv = [python, "-m", "mtpstack", "worker", "--model", str(target), "--draft-model", str(drafter),
            "--max-num-seqs", str(width), "--served-model-name", "tiny", "--port", str(port)]
    try:
        yield start_workers({log.stem: (argv, port)}, log.parent, procs, 120, cwd=log.parent)[log.stem], port
    finally:
        procs.stop_all(timeout=30)


def worker_after(proc: Process, pause: float) -> dict:
    """`pause` after its clients are done: the slots a worker still holds, and whether it died."""
    time.sleep(pause)
    active = json_answer(f"{proc.url}/health", timeout=10)[2]["active"]
    return {"leaked_slots": active, "crashed": int(not proc.alive())}


def run_worker(tmp: Path, args: argparse.Namespace) -> dict:
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    log = tmp / "worker.log"
    with hostile_worker(DEMO_TARGET, DEMO_HEAD, log) as (proc, port):
        out = {"malformed": malformed(port, args.requests, args.seed, "tiny", proc.alive),
               "unrouted_not_json": unrouted(proc.url)}
        out.update(worker_after(proc, 0.5))
    return {**out, "log_tracebacks": log.read_text(errors="replace").count("Traceback")}


def stalled(url: str, load) -> tuple[dict, object, object]:
    """`/health`'s slowest answer and a plain stream's largest gap, idle and during `load()`; and what it returned."""
    from devkit.stall import measure, plain_stream

    idle, loaded, got = measure(url, plain_stream(3500), STALL_IDLE_SECONDS, load)
    worst = {f"{phase}_{key}_max": round(getattr(m, attr), 3) for phase, m in (("idle", idle), ("loaded", loaded))
             for key, attr in (("health", "health_max"), ("gap", "stream_gap_max"))}
    return worst, loaded, got


def run_agent(tmp: Path, args: argparse.Namespace) -> dict:
    """The agent surfaces on a worker whose template has a tool-call format, and its stall while schemas compile."""
    from devkit.demo.agent import build_agent_pair
    from devkit.hostile import AGENT_SEEDS, agent_stream, seed_request
    from devkit.raw_http import leave_streams
    from devkit.stall import send_schemas

    target, drafter = build_agent_pair(tmp / "agent", seed=0)
    log = tmp / "agent-worker.log"
    with hostile_worker(target, drafter, log) as (proc, port):
        wrong_seeds = []
        for name in sorted(AGENT_SEEDS):
            path, body, param = seed_request(name, "tiny")
            status, _, payload = json_answer(proc.url + path, "POST", JSON, body, timeout=HOSTILE_HANG)
            if (status, (payload.get("error") or {}).get("param")) != (400, param):
                wrong_seeds.append(name)
        out = {"seeds": len(AGENT_SEEDS), "seeds_not_named": len(wrong_seeds),
               "requests": agent_requests(proc.url, args.agent, args.seed, "tiny"), "cut_streams": args.cut}
        asyncio.run(leave_streams(HOST, port, [agent_stream(i) for i in range(args.cut)]))
        st = out["stall"] = {"repeats": args.stall_repeats, "refused": 0}
        for r in range(args.stall_repeats):
            schemas = range(r * STALL_SCHEMAS, (r + 1) * STALL_SCHEMAS)  # none from the cache
            worst, _, statuses = stalled(proc.url, lambda: send_schemas(proc.url, schemas, STALL_WIDTH, HOSTILE_HANG))
            st["refused"] += statuses.count(400)
            for key, v in worst.items():
                st.setdefault(key, []).append(v)
        out.update(worker_after(proc, 1.0))  # the cut streams' sequences are dropped within a step
    lines, events = log_events(log)
    out["log_not_json"] = len(lines) - len(events)
    out["log_errors"] = sum(("Traceback" in line) + line.count('"level": "error"') for line in lines)
    return out


def flood_round(url: str, n: int, first: int, tag: str) -> dict:
    """One flood of `n` hostile schemas (`fuel_schema(first ...)`) with the probes, measured against idle."""
    from devkit.stall import BENIGN_SCHEMA, flood, flood_bodies, schema_request

    benign = {**BENIGN_SCHEMA, "title": tag}  # new to the worker each round
    probes = {"another client": (FLOOD_PROBE_DELAY, schema_request(benign, 16), OTHER_CLIENT),
              "same client": (FLOOD_PROBE_DELAY, schema_request({**benign, "description": "own"}, 16), None),
              "compiled before": (FLOOD_PROBE_DELAY, schema_request(WARM_SCHEMA, 16), None)}
    worst, loaded, result = stalled(url, lambda: flood(url, flood_bodies(range(first, first + n)), probes,
                                                       timeout=HOSTILE_HANG * 2))
    kinds = Counter(flood_answer_kind(a.status, a.error()) for a in result.hostile)
    return {
        "hostile": dict(sorted(kinds.items())),
        "probes": {name: {"status": a.status, "seconds": round(a.seconds, 3), "code": a.error().get("code")}
                   for name, a in result.probes.items()},
        **worst, "flood_seconds": round(loaded.seconds, 2),
    }


def run_flood(tmp: Path, args: argparse.Namespace) -> dict:
    """Grammar floods on the agent pair, 4 slots (the plain stream, three probes), this checkout's worker and
    `--against`'s in alternate order each repeat, each with its own schemas."""
    from devkit.demo.agent import build_agent_pair
    from devkit.stall import post, schema_request

    n, repeats, against = args.flood, args.flood_repeats, args.against
    target, drafter = build_agent_pair(tmp / "flood", seed=0)
    arms = {"this": sys.executable, **({"against": against} if against else {})}
    out: dict = {"hostile": n, "repeats": repeats, "arms": {a: [] for a in arms}, "against": against}
    with contextlib.ExitStack() as stack:
        urls = {}
        for arm, python in arms.items():
            proc, _ = stack.enter_context(hostile_worker(target, drafter, tmp / f"flood-{arm}.log", python, width=4))
            urls[arm] = proc.url
            post(proc.url, schema_request(WARM_SCHEMA, 16))
        for r in range(repeats):
            for arm in rotated(list(arms), r):
                first = (r * len(arms) + list(arms).index(arm)) * n
                out["arms"][arm].append(flood_round(urls[arm], n, first, f"r{r}"))
                say(f"flood: repeat {r + 1}/{repeats} on {arm}: {out['arms'][arm][-1]['probes']}")
    return out


async def hostile(args: argparse.Namespace, workdir: Path) -> tuple[dict, bool]:
    result = {"seed": args.seed}
    for name, run in (("validate", run_validate), ("proxy", run_proxy), ("worker", run_worker), ("agent", run_agent),
                      ("flood", run_flood)):
        if name in args.only:  # in a thread: blocking clients, and `run_agent` runs a loop of its own
            result[name] = await asyncio.to_thread(run, workdir, args)
    return result, all(v == 0 for v in must_be_zero(result).values())


# == proxy: what the admission proxy costs ============================================================
#: Pause between chunks of the paced upstream: a few ms, as a model writes tokens; its wait before a plain answer.
PACED_INTERVAL, PACED_DELAY = 0.002, 0.02
#: Per cell, per target, per round: (requests at 1 client, requests at 4 clients); the warm-up's, discarded.
PROXY_COUNTS = {"plain/instant": (200, 400), "plain/paced": (20, 40), "sse/instant": (10, 20), "sse/paced": (2, 8)}
WARMUP_COUNTS = {"plain/instant": (50,), "plain/paced": (5,), "sse/instant": (2,), "sse/paced": (2,)}
#: How often the page polls `/v1/fleet/status` (the page's own POLL_MS).
DASHBOARD_POLL_SECONDS = 1.0
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
CHAT = "/v1/chat/completions"


async def poll_dashboard(base: str, counts: dict) -> None:
    """One open dashboard: the page once, then its data once a second, until cancelled."""
    async with aiohttp.ClientSession() as http:
        for path in itertools.chain(["/dashboard"], itertools.repeat("/v1/fleet/status")):
            try:
                async with http.get(base + path) as r:
                    await r.read()
                    counts["polls"] += path != "/dashboard"
                    counts["failed"] += r.status != 200
            except aiohttp.ClientError:
                counts["failed"] += 1
            await asyncio.sleep(DASHBOARD_POLL_SECONDS if path != "/dashboard" else 0)


async def proxy_stack(args: argparse.Namespace, workdir: Path) -> tuple[dict, dict, str | None]:
    """The two scripted upstreams, a proxy per loop (and the baseline's), nginx: each target's URL per upstream mode,
    and the pid whose CPU counts (for `direct`, the upstream's)."""
    urls: dict[str, dict[str, str]] = {"direct": {}}
    pids: dict[str, dict[str, int]] = {"direct": {}}
    workers = {}
    for mode, interval, delay in (("instant", 0.0, 0.0), ("paced", PACED_INTERVAL, PACED_DELAY)):
        stamp = ["--stamp"] if mode == "paced" else []
        up = await fake_process(CHILDREN, workdir, f"upstream-{mode}", mode, 4, "--chunks", str(PROXY_CHUNKS),
                                "--interval", str(interval), "--delay", str(delay), *stamp)
        urls["direct"][mode], pids["direct"][mode], workers[mode] = up.url, up.process.pid, up.worker_config()
    if nginx := nginx_program():
        listen = {mode: free_port() for mode in workers}  # the instant upstream's first: nginx's URL, checked ready
        ng = await ready(start_nginx(CHILDREN, nginx, workdir, {listen[m]: workers[m]["port"] for m in workers},
                                     cwd=ROOT), "/health", 30.0)
        urls["nginx"], pids["nginx"] = {m: url_of(HOST, p) for m, p in listen.items()}, dict.fromkeys(workers, ng.pid)
    else:
        say("nginx is not installed (Debian: apt-get install nginx-light); comparing without it")
    ours = {f"mtpstack-{loop}": (sys.executable, ("--loop", loop)) for loop in args.loops or ()}
    ours = ours or {"mtpstack": (sys.executable, ())}
    if args.baseline:  # another checkout's proxy (its own venv's interpreter) in the same rounds
        ours["mtpstack-baseline"] = (args.baseline, ())
    for name, (python, extra) in ours.items():
        proxy = {"concurrencyLimit": 4, "queue": {"maxWaiting": 64, "timeoutSeconds": 60}}
        proc = await proxy_process(CHILDREN, workdir, name, proxy, workers, python, extra)
        urls[name], pids[name] = dict.fromkeys(workers, proc.url), dict.fromkeys(workers, proc.pid)
    return urls, pids, nginx_version(nginx)


async def proxy_round(sessions: dict, urls: dict, pids: dict, rnd: int, counts: dict = PROXY_COUNTS) -> dict:
    """One round: every cell on every target, the targets in this round's order; each one's samples and CPU."""
    cells: dict = {}
    for cell_key, ns in counts.items():
        kind, mode = cell_key.split("/")
        body = json.dumps({**BODY, "model": mode, "stream": kind == "sse"}).encode()
        one = partial(stream, stamped=mode == "paced") if kind == "sse" else plain
        for clients, n in zip((1, 4), ns):
            key = f"{cell_key}/{clients}c"
            cell = cells[key] = {}
            for t in rotated(list(urls), rnd):
                s, c0 = Sample(), cpu_seconds(pids[t][mode])  # direct: the upstream's own CPU, for reference

                async def client() -> None:  # awaited within this iteration
                    for _ in range(n // clients):
                        await one(sessions[t], urls[t][mode] + CHAT, body, s)

                await asyncio.gather(*(client() for _ in range(clients)))
                cpu = cpu_seconds(pids[t][mode]) - c0
                if s.errors:
                    say(f"warning: {s.errors} failed requests: {t} {key}")
                cell[t] = {"latency": s.latency, "first_chunk": s.first_chunk, "chunk_delay": s.chunk_delay,
                           "count": len(s.latency), "cpu": cpu, "errors": s.errors}
    return cells


async def proxy(args: argparse.Namespace, workdir: Path) -> tuple[dict, bool]:
    urls, pids, nginx = await proxy_stack(args, workdir)
    ours = next(t for t in urls if t.startswith("mtpstack"))
    polled = {"polls": 0, "failed": 0}
    poller = asyncio.create_task(poll_dashboard(urls[ours]["instant"], polled)) if args.dashboard_poll else None
    sessions = {t: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False) for t in urls}
    try:
        await proxy_round(sessions, urls, pids, 0, WARMUP_COUNTS)  # discarded
        measured = [await proxy_round(sessions, urls, pids, rnd) for rnd, _ in rounds(0, args.rounds)]
    finally:
        for s in sessions.values():
            await s.close()
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
    proxies = [t for t in urls if t != "direct"]
    meta = {"rounds": args.rounds, "loops": args.loops, "chunks": PROXY_CHUNKS, "paced_interval_s": PACED_INTERVAL,
            "paced_delay_s": PACED_DELAY, "counts": PROXY_COUNTS, "warmup": WARMUP_COUNTS,
            "aiohttp": aiohttp.__version__, "nginx": nginx,
            "dashboard_poll": None if poller is None else {"interval_s": DASHBOARD_POLL_SECONDS, **polled}}
    return {"meta": meta, "summary": proxy_summary(measured, proxies), "rounds": measured, "proxies": proxies}, True


def loops_arg(value: str) -> list[str]:
    loops = value.split(",")
    if any(v not in ("uvloop", "asyncio") for v in loops) or len(set(loops)) < len(loops):
        raise argparse.ArgumentTypeError(f"expected one or both of uvloop, asyncio, comma-separated: {value}")
    return loops


# == tenant: fair queueing between tenants ==========================================================
KEYS = {"flood": "sk-bench-flood", "steady": "sk-bench-steady"}
#: The worker's batch width and the proxy's gate; tenant `flood`'s streams at once, each one's chunks and their pace.
TENANT = {"gate": 2, "flood": 16, "chunks": 100, "interval": 0.01}


async def tenant_phase(url: str, log: Path, tag: str, seconds: float) -> dict:
    stream_body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}],
                              "x_fake": {"chunks": TENANT["chunks"], "interval": TENANT["interval"]}}).encode()
    plain_body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    flood, steady = Sample(), Sample()
    end = time.monotonic() + seconds
    auth = lambda tenant, **more: {"Authorization": f"Bearer {KEYS[tenant]}", **more}  # noqa: E731
    async with aiohttp.ClientSession(headers=auth("flood"), connector=aiohttp.TCPConnector(limit=0)) as fs, \
            aiohttp.ClientSession(headers=auth("steady", **{"X-Request-Id": tag})) as ss:

        async def flooder() -> None:
            while time.monotonic() < end:
                await stream(fs, url, stream_body, flood)

        floods = [asyncio.create_task(flooder()) for _ in range(TENANT["flood"])]
        await asyncio.sleep(1.0)  # the flood fills the gate and the queue first
        end += 1.0
        sent = []
        for i in range(int(seconds)):  # `steady`: one plain request a second
            await asyncio.sleep(max(0.0, end - seconds + i - time.monotonic()))
            sent.append(asyncio.create_task(plain(ss, url, plain_body, steady)))
        await asyncio.gather(*sent, *floods)
    await asyncio.sleep(0.3)  # the last request lines are written after their answers
    waits = [e["queue_wait_ms"] / 1000 for e in request_events(log) if e.get("request_id") == tag]
    return {"steady_queue_wait": waits, "steady_latency": steady.latency, "steady_errors": steady.errors,
            "flood_served": len(flood.latency), "flood_errors": flood.errors}


async def tenant(args: argparse.Namespace, workdir: Path) -> tuple[dict, bool]:
    keys = workdir / "keys"
    keys.write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    workers = {"w": (await fake_process(CHILDREN, workdir, "upstream", "m", TENANT["gate"])).worker_config()}
    urls = {}
    for mode, fair in TENANT_MODES.items():
        proxy = {"concurrencyLimit": TENANT["gate"], "apiKeysFile": str(keys), "fairQueueing": fair,
                 "queue": {"maxWaiting": 64, "timeoutSeconds": 120}}
        urls[mode] = (await proxy_process(CHILDREN, workdir, f"proxy-{mode}", proxy, workers)).url + CHAT
    phases = []
    for rnd, _ in rounds(0, args.rounds):
        phases.append({})
        for mode in rotated(list(TENANT_MODES), rnd):
            r = phases[-1][mode] = await tenant_phase(urls[mode], workdir / f"proxy-{mode}.log", f"steady-{rnd}-{mode}",
                                                      args.seconds)
            say(f"round {rnd + 1}/{args.rounds} {mode}: steady p50 {percentile(r['steady_queue_wait'], 50):.3f} s, "
                f"p95 {percentile(r['steady_queue_wait'], 95):.3f} s")
    return {"rounds": phases, "settings": {"rounds": args.rounds, "seconds": args.seconds, **TENANT}}, True


# == main ==============================================================================================
def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/scripts/load_bench.py", description="The whole stack under load: faults "
                                 "(no mode), hostile input, the proxy's cost, fair queueing.")
    modes = ap.add_subparsers(title="modes", metavar="MODE")
    h = modes.add_parser("hostile", help="hostile input at volume (docs/hardening.md)")
    p = modes.add_parser("proxy", help="the proxy's added latency and CPU, against direct and nginx (docs/proxy.md)")
    t = modes.add_parser("tenant", help="what one tenant's flood costs another's requests (docs/proxy.md)")
    for parser, run, report, out in ((ap, faults, report_lines, "load-bench.json"), (h, hostile, hostile_lines, None),
                                     (p, proxy, proxy_lines, "proxy-bench.json"),
                                     (t, tenant, tenant_lines, "tenant-bench.json")):
        parser.add_argument("--out", default=out, help=f"raw figures as JSON (default: {out})")
        parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs, tiny models)")
        parser.set_defaults(run=run, report=report)
    ap.add_argument("--quick", action="store_true", help="a smoke run of about a minute (smaller counts)")
    ap.add_argument("--skip-real", action="store_true", help="fake upstreams only (no mlx needed)")
    ap.add_argument("--only", nargs="+", choices=PHASE_KEYS, help="run only these phases (default: all)")
    for key in FULL:
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"(default: {FULL[key]}, --quick: {QUICK[key]})")
    for option, (default, what) in HOSTILE_COUNTS.items():
        h.add_argument(f"--{option}", type=int, default=default, help=f"{what} (default: {default})")
    h.add_argument("--against", metavar="PYTHON", help="also flood a worker run by this Python (another checkout's)")
    h.add_argument("--only", nargs="+", choices=HOSTILE_PHASES, default=HOSTILE_PHASES, help="run only these phases")
    h.add_argument("--seed", type=int, default=1)
    h.add_argument("--json", action="store_true", help="print the raw counts as JSON")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default: 5)")
    p.add_argument("--loops", type=loops_arg, metavar="LOOP,LOOP",
                   help="one `mtpstack proxy` per event loop (`--loop`: uvloop, asyncio), side by side")
    p.add_argument("--baseline", metavar="PYTHON", help="also run the proxy of another checkout, by its venv's "
                   "interpreter (e.g. /work/main/.venv/bin/python), as `mtpstack-baseline` in the same rounds")
    p.add_argument("--dashboard-poll", action="store_true", help="keep one dashboard page polling the proxy throughout")
    t.add_argument("--rounds", type=int, default=3, help="rounds: a phase with fair queueing on, one off (default: 3)")
    t.add_argument("--seconds", type=float, default=20,
                   help="length of a phase: tenant `steady` sends one request a second (default: 20)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    workdir = Path(tempfile.mkdtemp(prefix="mtpstack-load-bench-"))
    say(f"work directory: {workdir}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt, as Ctrl-C does
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (SIGINT ignored)
    t0, load_start = time.monotonic(), loadavg()
    try:
        result, ok = asyncio.run(args.run(args, workdir))
    except KeyboardInterrupt:
        say("interrupted; stopping every process started here")
        stop_all()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return 130
    finally:
        stop_all()
    meta = result["meta"] = run_meta(checkout=True, loadavg_start=load_start, seconds=round(time.monotonic() - t0),
                                     **result.get("meta", {}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
        say(f"figures written to {args.out}")
    print(json.dumps(result, indent=2) if getattr(args, "json", False) else "\n".join(args.report(result)))
    if max(load_start[0], meta["loadavg"][0]) > (meta["cpus"] or 1):
        say(f"the load average exceeded the CPU count ({meta['cpus']}): other work shared the CPUs; read the spread")
    if args.keep or not ok:
        say(f"work directory kept{'' if ok else ' for its logs'}: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
