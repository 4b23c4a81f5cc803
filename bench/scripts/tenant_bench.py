"""Fair queueing between tenants: what one tenant's flood costs another tenant's requests.

    .venv/bin/python bench/scripts/tenant_bench.py [--rounds 3] [--seconds 20] [--out tenant-bench.json]

One scripted worker (`devkit.fake_upstream`, gate `--gate`, streams of `--chunks` chunks `--interval`
apart: a long generation) behind two `mtpstack proxy` processes with the same two tenants' keys, one with
`proxy.fairQueueing` on and one with it off, used one at a time in alternating order, round by round.
Each phase: tenant `flood` keeps `--flood` streamed requests in flight (each client sends its next as
soon as its last ended), and tenant `steady` sends one plain request a second for `--seconds` seconds.
Reported: `steady`'s queue wait (the proxy's own `queue_wait_ms` from its request log) p50 and p95 per
phase, then their median and min-max over rounds, fair queueing on and off side by side; and the
flood's streams served per phase. The clients are `mtpstack.bench.stacks`' (`stream`, `plain`), the servers
started as it starts them.

A benchmark script, not a test: the machines are shared and noisy; read the spread.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from mtpstack.bench.stacks import Sample, plain, start, stream, wait_ready
from mtpstack.bench.stats import percentile, summarize
from mtpstack.runtime import Process, free_port

KEYS = {"flood": "sk-bench-flood", "steady": "sk-bench-steady"}
MODES = {"fair": True, "fifo": False}


def proxy_config(port: int, upstream: int, gate: int, keys: Path, fair: bool) -> dict:
    return {
        "proxy": {"port": port, "concurrencyLimit": gate, "apiKeysFile": str(keys), "fairQueueing": fair,
                  "queue": {"maxWaiting": 64, "timeoutSeconds": 120}},
        "workers": {"w": {"model": "m", "target": {"path": "/bench/m", "bits": 4}, "maxNumSeqs": gate, "port": upstream}},
    }


def request_lines(log: Path, request_id: str) -> list[dict]:
    """The proxy's request log lines of one phase's `steady` requests (all sent with one request id)."""
    records = (json.loads(line) for line in log.read_text().splitlines() if request_id in line and line.startswith("{"))
    return [r for r in records if r.get("event") == "request" and r.get("request_id") == request_id]


async def phase(url: str, log: Path, tag: str, args: argparse.Namespace) -> dict:
    stream_body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}],
                              "x_fake": {"chunks": args.chunks, "interval": args.interval}}).encode()
    plain_body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    flood, steady = Sample(), Sample()
    end = time.monotonic() + args.seconds
    auth = lambda tenant, **more: {"Authorization": f"Bearer {KEYS[tenant]}", **more}  # noqa: E731
    async with aiohttp.ClientSession(headers=auth("flood"), connector=aiohttp.TCPConnector(limit=0)) as fs, \
            aiohttp.ClientSession(headers=auth("steady", **{"X-Request-Id": tag})) as ss:

        async def flooder() -> None:
            while time.monotonic() < end:
                await stream(fs, url, stream_body, flood)

        async def steady_client() -> None:
            sent = []
            for i in range(int(args.seconds)):
                await asyncio.sleep(max(0.0, end - args.seconds + i - time.monotonic()))
                sent.append(asyncio.create_task(plain(ss, url, plain_body, steady)))
            await asyncio.gather(*sent)

        floods = [asyncio.create_task(flooder()) for _ in range(args.flood)]
        await asyncio.sleep(1.0)  # the flood fills the gate and the queue first
        end += 1.0
        await steady_client()
        await asyncio.gather(*floods)
    await asyncio.sleep(0.3)  # the last request lines are written after their answers
    waits = [r["queue_wait_ms"] / 1000 for r in request_lines(log, tag)]
    return {"steady_queue_wait": waits, "steady_latency": steady.latency, "steady_errors": steady.errors,
            "flood_served": len(flood.latency), "flood_errors": flood.errors}


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    s = summarize(values)
    return f"{s.median * 1000:.0f} ({s.min * 1000:.0f}..{s.max * 1000:.0f})"


async def bench(args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="tenant-bench-"))
    keys = workdir / "keys"
    keys.write_text("".join(f"{t} {k}\n" for t, k in KEYS.items()))
    up_port = free_port()
    procs: list[Process] = []
    load_start = list(os.getloadavg())
    try:
        up = start("upstream", [sys.executable, "-m", "devkit.fake_upstream", "--port", str(up_port), "--gate", str(args.gate)],
                   workdir, up_port, cwd=_checkout.ROOT)
        procs.append(up)
        await wait_ready(up, "/health")
        urls, logs = {}, {}
        for mode, fair in MODES.items():
            port = free_port()
            (workdir / f"{mode}.json").write_text(json.dumps(proxy_config(port, up_port, args.gate, keys, fair)))
            p = start(f"proxy-{mode}", [sys.executable, "-m", "mtpstack", "proxy", "--config", str(workdir / f"{mode}.json")], workdir, port, cwd=_checkout.ROOT)
            procs.append(p)
            await wait_ready(p, "/readyz")
            urls[mode], logs[mode] = f"http://127.0.0.1:{port}/v1/chat/completions", workdir / f"proxy-{mode}.log"
        rounds = []
        for rnd in range(args.rounds):
            order = list(MODES) if rnd % 2 == 0 else list(reversed(MODES))
            result = {}
            for mode in order:
                result[mode] = await phase(urls[mode], logs[mode], f"steady-{rnd}-{mode}", args)
                print(f"round {rnd + 1}/{args.rounds} {mode}: steady p50 {percentile(result[mode]['steady_queue_wait'], 50):.3f} s, "
                      f"p95 {percentile(result[mode]['steady_queue_wait'], 95):.3f} s", file=sys.stderr)
            rounds.append(result)
    finally:
        for p in reversed(procs):
            p.stop()
    return {"rounds": rounds, "load_average": {"start": load_start, "end": list(os.getloadavg())},
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "settings": vars(args) | {"out": None}}


def report(results: dict) -> list[str]:
    rounds = results["rounds"]
    lines = [f"{len(rounds)} rounds; tenant `steady`'s queue wait in ms, per phase p50 / p95, median (min..max) over rounds; "
             f"load average {results['load_average']['start'][0]:.1f} -> {results['load_average']['end'][0]:.1f}",
             f"{'fair queueing':<14} {'steady p50':>18} {'steady p95':>18} {'steady latency p50':>20} {'flood streams served':>22} {'errors':>7}"]
    for mode in MODES:
        per = [r[mode] for r in rounds]
        p50 = [percentile(p["steady_queue_wait"], 50) for p in per]
        p95 = [percentile(p["steady_queue_wait"], 95) for p in per]
        lat = [percentile(p["steady_latency"], 50) for p in per]
        served = summarize([p["flood_served"] for p in per])
        errors = sum(p["steady_errors"] + p["flood_errors"] for p in per)
        lines.append(f"{'on' if MODES[mode] else 'off':<14} {fmt(p50):>18} {fmt(p95):>18} {fmt(lat):>20} "
                     f"{served.median:>10.0f} ({served.min:.0f}..{served.max:.0f}) {errors:>7}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each one phase with fair queueing on and one off (default: 3)")
    ap.add_argument("--seconds", type=float, default=20, help="length of a phase: tenant `steady` sends one request a second (default: 20)")
    ap.add_argument("--flood", type=int, default=16, help="tenant `flood`'s concurrent streamed requests (default: 16)")
    ap.add_argument("--gate", type=int, default=2, help="the worker's batch width and the proxy's gate (default: 2)")
    ap.add_argument("--chunks", type=int, default=100, help="chunks of each flood stream (default: 100)")
    ap.add_argument("--interval", type=float, default=0.01, help="seconds between a flood stream's chunks (default: 0.01)")
    ap.add_argument("--out", default="tenant-bench.json", help="raw values as JSON (default: tenant-bench.json)")
    args = ap.parse_args(argv)
    results = asyncio.run(bench(args))
    Path(args.out).write_text(json.dumps(results, indent=1))
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
