"""What the admission proxy costs: added latency and CPU, against calling the upstream directly
and against nginx as a reverse proxy, measured side by side in interleaved rounds of one run.

    .venv/bin/python bench/scripts/proxy_bench.py [--rounds 5] [--out proxy-bench.json] [--dashboard-poll]

Three processes per path: this script (the clients), a scripted upstream
(`devkit.fake_upstream`, one answering at once and one pacing its chunks like a model), and the
proxy under test: `mtpstack proxy` or Debian's nginx (`worker_processes 1`, one process,
buffering off, keep-alive to the upstream), both started here on loopback. Cells: plain
requests and 256-chunk SSE streams, 1 and 4 concurrent clients, instant and paced upstream.

Per cell and round: p50/p99 latency (plain) or time to first chunk and stream duration (SSE),
each minus the direct path's in the same round ("added"); proxy CPU per request and per chunk
from the kernel's per-thread run time (/proc/PID/task/*/schedstat, nanoseconds; /proc/PID/stat
ticks where schedstat is missing). Reported: median and min-max over rounds, and the ratios of
mtpstack to nginx. Raw values go to the JSON file, the table to stdout, progress to stderr.

`--loops uvloop,asyncio` runs one `mtpstack proxy` per event loop (`--loop`), named
`mtpstack-uvloop` and `mtpstack-asyncio`, in the same interleaved rounds, and gives the first's
ratio to each other beside their ratios to nginx. `--baseline PYTHON` adds another checkout's proxy,
started by that checkout's interpreter (`/work/main/.venv/bin/python`: `main`'s), as
`mtpstack-baseline` in the same rounds: a change's cost side by side with the code before it.

`--dashboard-poll` keeps one operator's page open on the mtpstack proxy for the whole run: it
loads `/dashboard` and then polls `/v1/fleet/status` once a second, as the page does.

A benchmark script, not a test: the machines are shared and noisy; read the spread.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from mtpstack.bench.stacks import Sample, cpu_seconds, nginx_conf, plain, start, stream, wait_ready
from mtpstack.bench.stats import percentile
from mtpstack.runtime import Process, free_port

ROOT = _checkout.ROOT
CHUNKS = 256
#: Pause between chunks of the paced upstream: a few ms, as a model writes tokens.
PACED_INTERVAL = 0.002
#: The paced upstream's wait before a plain answer: a short generation.
PACED_DELAY = 0.02
#: Per cell, per target, per round: (requests at 1 client, requests at 4 clients).
COUNTS = {
    ("plain", "instant"): (200, 400),
    ("plain", "paced"): (20, 40),
    ("sse", "instant"): (10, 20),
    ("sse", "paced"): (2, 8),
}
WARMUP_PLAIN, WARMUP_STREAMS = 50, 2
#: How often the page polls `/v1/fleet/status` (the page's own POLL_MS).
DASHBOARD_POLL_SECONDS = 1.0
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}


# -- cells --------------------------------------------------------------------------------
async def run_cell(session: aiohttp.ClientSession, url: str, kind: str, clients: int, n: int, model: str) -> Sample:
    body = json.dumps({**BODY, "model": model, "stream": kind == "sse"}).encode()
    s = Sample()
    per_client = n // clients

    async def client() -> None:
        for _ in range(per_client):
            if kind == "sse":
                await stream(session, url, body, s, stamped=model == "paced")
            else:
                await plain(session, url, body, s)

    await asyncio.gather(*(client() for _ in range(clients)))
    return s


# -- statistics and formatting (pure) --------------------------------------------------------
def spread(values: list[float]) -> dict:
    v = [x for x in values if x == x]
    if not v:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def fmt_us(s: dict, scale: float = 1e6) -> str:
    if s["median"] is None:
        return "-"
    return f"{s['median'] * scale:.0f} ({s['min'] * scale:.0f}..{s['max'] * scale:.0f})"


def fmt_ratio(s: dict) -> str:
    if s["median"] is None:
        return "-"
    return f"{s['median']:.2f}x ({s['min']:.2f}..{s['max']:.2f})"


def comparisons(proxies: list[str]) -> list[tuple[str, str]]:
    """The per-round ratios reported: each mtpstack proxy to nginx, and the first mtpstack proxy
    (`--loops`' first loop) to each other one."""
    ours = [p for p in proxies if p.startswith("mtpstack")]
    return [(p, "nginx") for p in ours if "nginx" in proxies] + [(ours[0], p) for p in ours[1:]]


def summarize(rounds: list[dict], proxies: list[str]) -> dict:
    """Per cell: per-round added latencies and CPU per unit, then their spread over rounds."""
    out: dict = {}
    for key in rounds[0]:
        kind = key.split("/")[0]
        per: dict[str, dict[str, list[float]]] = {p: {} for p in proxies}
        for rnd in rounds:
            cell = rnd[key]
            direct = cell["direct"]
            for p in proxies:
                if p not in cell:
                    continue
                m = cell[p]
                d = per[p]
                d.setdefault("added_p50", []).append(percentile(m["latency"], 50) - percentile(direct["latency"], 50))
                d.setdefault("added_p99", []).append(percentile(m["latency"], 99) - percentile(direct["latency"], 99))
                d.setdefault("cpu_per_request", []).append(m["cpu"] / max(1, m["count"]))
                if kind == "sse":
                    d.setdefault("added_first_chunk_p50", []).append(
                        percentile(m["first_chunk"], 50) - percentile(direct["first_chunk"], 50)
                    )
                    d.setdefault("first_chunk_p50", []).append(percentile(m["first_chunk"], 50))
                    d.setdefault("cpu_per_chunk", []).append(m["cpu"] / max(1, m["count"] * CHUNKS))
                    if m.get("chunk_delay") and direct.get("chunk_delay"):
                        d.setdefault("added_chunk_delay_p50", []).append(
                            percentile(m["chunk_delay"], 50) - percentile(direct["chunk_delay"], 50)
                        )
                        d.setdefault("added_chunk_delay_p99", []).append(
                            percentile(m["chunk_delay"], 99) - percentile(direct["chunk_delay"], 99)
                        )
                    d.setdefault("throughput_vs_direct", []).append(
                        statistics.median(direct["latency"]) / statistics.median(m["latency"])
                    )
        cell_out = {p: {k: spread(v) for k, v in per[p].items()} for p in proxies if per[p]}
        cell_out["direct"] = {
            "upstream_cpu_per_request": spread([r[key]["direct"]["cpu"] / max(1, r[key]["direct"]["count"]) for r in rounds])
        }
        for a, b in comparisons(proxies):
            if per.get(a) and per.get(b):
                cell_out[f"{a}_vs_{b}"] = {
                    k: spread([x / y for x, y in zip(per[a][k], per[b][k]) if y > 0])
                    for k in ("cpu_per_request", "cpu_per_chunk", "added_p50") if k in per[a]
                }
        out[key] = cell_out
    return out


def table_lines(summary: dict, proxies: list[str]) -> list[str]:
    """The printed table: one row per cell and proxy; times in microseconds, median (min..max) over rounds."""
    w = max(9, *map(len, proxies))  # the proxy column: as wide as its longest name
    head = f"{'cell':<24} {'proxy':<{w}} {'added p50 us':>18} {'added p99 us':>20} {'first chunk +us':>18} {'CPU/req us':>16} {'CPU/chunk us':>14}"
    lines = [head, "-" * len(head)]
    for key, cell in summary.items():
        up = cell.get("direct", {}).get("upstream_cpu_per_request")
        if up:
            lines.append(f"{key:<24} {'(direct)':<{w}} {'-':>18} {'-':>20} {'-':>18} {fmt_us(up):>16} {'':>14}  <- the upstream's own CPU")
        for p in proxies:
            if p not in cell:
                continue
            c = cell[p]
            lines.append(
                f"{key:<24} {p:<{w}} {fmt_us(c['added_p50']):>18} {fmt_us(c['added_p99']):>20} "
                f"{fmt_us(c['added_first_chunk_p50']) if 'added_first_chunk_p50' in c else '-':>18} "
                f"{fmt_us(c['cpu_per_request']):>16} {fmt_us(c['cpu_per_chunk']) if 'cpu_per_chunk' in c else '-':>14}"
            )
        for p in proxies:
            c = cell.get(p, {})
            extra = []
            if "throughput_vs_direct" in c:
                extra.append(f"stream throughput vs direct {fmt_ratio(c['throughput_vs_direct'])}")
            if "added_chunk_delay_p50" in c:
                extra.append(
                    f"added per-chunk delay p50 {fmt_us(c['added_chunk_delay_p50'])} us, p99 {fmt_us(c['added_chunk_delay_p99'])} us"
                )
            if extra:
                lines.append(f"{'':<24} {p:<{w}} " + "; ".join(extra))
        for a, b in comparisons(proxies):
            if r := cell.get(f"{a}_vs_{b}"):
                parts = [f"{k} {fmt_ratio(v)}" for k, v in r.items()]
                lines.append(f"{'':<24} {'ratio':<{w}} {a}/{b}: " + ", ".join(parts))
    return lines


# -- the run ------------------------------------------------------------------------------
@dataclass
class PagePoller:
    """One open dashboard: the page once, then its data once a second, until stopped."""

    base: str
    polls: int = 0
    failed: int = 0

    async def run(self) -> None:
        async with aiohttp.ClientSession() as http:
            async with http.get(self.base + "/dashboard") as r:
                await r.read()
                if r.status != 200:
                    self.failed += 1
            while True:
                try:
                    async with http.get(self.base + "/v1/fleet/status") as r:
                        await r.read()
                        self.polls += 1
                        self.failed += r.status != 200
                except aiohttp.ClientError:
                    self.failed += 1
                await asyncio.sleep(DASHBOARD_POLL_SECONDS)


async def bench(args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    procs: list[Process] = []
    py = sys.executable
    ports = {k: free_port() for k in ("up_instant", "up_paced", "nginx_instant", "nginx_paced")}
    # One `mtpstack proxy` per `--loops` entry (one with its default loop without it), each on its own port.
    ours = {f"mtpstack-{loop}": ["--loop", loop] for loop in args.loops} if args.loops else {"mtpstack": []}
    pythons = dict.fromkeys(ours, py)
    if args.baseline:  # another checkout's proxy (its own venv's interpreter) in the same rounds
        ours["mtpstack-baseline"], pythons["mtpstack-baseline"] = [], args.baseline
    ports.update({name: free_port() for name in ours})
    up_pids: dict[str, int] = {}
    load_start = list(os.getloadavg())
    try:
        for mode, interval, delay in (("instant", 0.0, 0.0), ("paced", PACED_INTERVAL, PACED_DELAY)):
            p = start(
                f"upstream-{mode}",
                [py, "-m", "devkit.fake_upstream", "--port", str(ports[f"up_{mode}"]), "--gate", "4",
                 "--chunks", str(CHUNKS), "--interval", str(interval), "--delay", str(delay), "--name", mode, *(["--stamp"] if mode == "paced" else [])],
                workdir, ports[f"up_{mode}"], cwd=ROOT,
            )
            procs.append(p)
            up_pids[mode] = p.pid
            await wait_ready(p, "/health")
        config = {
            "proxy": {"concurrencyLimit": 4, "queue": {"maxWaiting": 64, "timeoutSeconds": 60}},
            "workers": {
                mode: {"model": mode, "target": {"path": f"/bench/{mode}", "bits": 4}, "maxNumSeqs": 4, "port": ports[f"up_{mode}"]}
                for mode in ("instant", "paced")
            },
        }
        pids: dict[str, int] = {}
        for name, extra in ours.items():
            (workdir / f"{name}.json").write_text(json.dumps({**config, "proxy": {**config["proxy"], "port": ports[name]}}))
            mtp = start(name, [pythons[name], "-m", "mtpstack", "proxy", "--config", str(workdir / f"{name}.json"), *extra], workdir, ports[name], cwd=ROOT)
            procs.append(mtp)
            await wait_ready(mtp, "/readyz")
            pids[name] = mtp.pid
        targets = ["direct", *ours]
        nginx = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx") or None
        nginx_version = None
        if nginx and not args.no_nginx:
            conf = workdir / "nginx.conf"
            conf.write_text(nginx_conf(workdir, {ports["nginx_instant"]: ports["up_instant"], ports["nginx_paced"]: ports["up_paced"]}))
            nginx_version = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip()
            ng = start("nginx", [nginx, "-c", str(conf), "-p", str(workdir)], workdir, ports["nginx_instant"], cwd=ROOT)
            procs.append(ng)
            await wait_ready(ng, "/health")
            pids["nginx"] = ng.pid
            targets.insert(1, "nginx")
        else:
            print("note: nginx is not installed (Debian: apt-get install nginx-light); comparing with direct only", file=sys.stderr)

        def url(target: str, mode: str) -> str:
            port = ports[f"up_{mode}"] if target == "direct" else ports[f"nginx_{mode}"] if target == "nginx" else ports[target]
            return f"http://127.0.0.1:{port}/v1/chat/completions"

        poller = PagePoller(f"http://127.0.0.1:{ports[next(iter(ours))]}") if args.dashboard_poll else None
        poll_task = asyncio.create_task(poller.run()) if poller is not None else None
        connector_kw = {"limit": 0, "force_close": False}
        sessions = {t: aiohttp.ClientSession(connector=aiohttp.TCPConnector(**connector_kw), auto_decompress=False) for t in targets}
        try:
            for t in targets:  # warm-up, discarded
                for mode in ("instant", "paced"):
                    await run_cell(sessions[t], url(t, mode), "plain", 1, WARMUP_PLAIN if mode == "instant" else 5, mode)
                    await run_cell(sessions[t], url(t, mode), "sse", 1, WARMUP_STREAMS, mode)
            rounds = []
            started = time.monotonic()
            for rnd in range(args.rounds):
                cells: dict = {}
                for (kind, mode), (n1, n4) in COUNTS.items():
                    for clients, n in ((1, n1), (4, n4)):
                        key = f"{kind}/{mode}/{clients}c"
                        cell = cells[key] = {}
                        order = targets[rnd % len(targets):] + targets[: rnd % len(targets)]
                        for t in order:
                            # Proxies: the proxy's CPU. Direct: the upstream's own, for reference.
                            pid = pids.get(t, up_pids[mode])
                            c0 = cpu_seconds(pid)
                            s = await run_cell(sessions[t], url(t, mode), kind, clients, n, mode)
                            cpu = cpu_seconds(pid) - c0
                            if s.errors:
                                print(f"warning: {s.errors} failed requests: {t} {key}", file=sys.stderr)
                            cell[t] = {
                                "latency": s.latency, "first_chunk": s.first_chunk, "chunk_delay": s.chunk_delay,
                                "count": len(s.latency), "cpu": cpu, "errors": s.errors,
                            }
                rounds.append(cells)
                print(f"round {rnd + 1}/{args.rounds} done ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        finally:
            for s in sessions.values():
                await s.close()
            if poll_task is not None:
                poll_task.cancel()
                await asyncio.gather(poll_task, return_exceptions=True)
        proxies = [t for t in targets if t != "direct"]
        return {
            "meta": {
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "rounds": args.rounds,
                "loops": args.loops,
                "chunks": CHUNKS,
                "paced_interval_s": PACED_INTERVAL,
                "paced_delay_s": PACED_DELAY,
                "counts": {f"{k[0]}/{k[1]}": v for k, v in COUNTS.items()},
                "warmup": {"plain": WARMUP_PLAIN, "streams": WARMUP_STREAMS},
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "aiohttp": aiohttp.__version__,
                "nginx": nginx_version,
                "dashboard_poll": None if poller is None else {
                    "interval_s": DASHBOARD_POLL_SECONDS, "polls": poller.polls, "failed": poller.failed,
                },
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                # Other work on the machine inflates every path's spread; recorded to read it by.
                "loadavg_start": load_start,
                "loadavg_end": list(os.getloadavg()),
            },
            "summary": summarize(rounds, proxies),
            "rounds": rounds,
            "proxies": proxies,
        }
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def loops_arg(value: str) -> list[str]:
    loops = value.split(",")
    if any(v not in ("uvloop", "asyncio") for v in loops) or len(set(loops)) < len(loops):
        raise argparse.ArgumentTypeError(f"expected one or both of uvloop, asyncio, comma-separated: {value}")
    return loops


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Added latency and CPU of `mtpstack proxy` vs direct and vs nginx.")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default: 5)")
    ap.add_argument("--out", default="proxy-bench.json", help="raw values and summary as JSON (default: proxy-bench.json)")
    ap.add_argument("--no-nginx", action="store_true", help="compare with the direct path only")
    ap.add_argument("--loops", type=loops_arg, default=None, metavar="LOOP,LOOP",
                    help="one `mtpstack proxy` per event loop (`--loop`: uvloop, asyncio), side by side, e.g. `uvloop,asyncio`")
    ap.add_argument("--baseline", metavar="PYTHON", default=None,
                    help="also run the proxy of another checkout, by its venv's interpreter (e.g. /work/main/.venv/bin/python), "
                         "as `mtpstack-baseline` in the same rounds")
    ap.add_argument("--dashboard-poll", action="store_true", help="keep one dashboard page polling the mtpstack proxy throughout")
    args = ap.parse_args(argv)
    result = asyncio.run(bench(args))
    Path(args.out).write_text(json.dumps(result, indent=1))
    meta = result["meta"]
    print(f"{meta['rounds']} interleaved rounds; times in microseconds, median (min..max) over rounds; "
          f"added = proxied minus direct in the same round; load average {meta['loadavg_start'][0]:.1f} -> "
          f"{meta['loadavg_end'][0]:.1f} on {meta['cpus']} CPUs")
    print("\n".join(table_lines(result["summary"], result["proxies"])))
    if (poll := meta["dashboard_poll"]) is not None:
        print(f"dashboard: one page polled /v1/fleet/status {poll['polls']} times ({poll['failed']} failed)")
    if max(meta["loadavg_start"][0], meta["loadavg_end"][0]) > (meta["cpus"] or 1):
        print(f"warning: the load average exceeded the CPU count ({meta['cpus']}): other work shared the CPUs, "
              "so the spread is wide; rerun on a quiet machine for tighter figures", file=sys.stderr)
    print(f"raw values: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
