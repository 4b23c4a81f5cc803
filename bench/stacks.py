"""Whole stacks for the benches that measure past one worker: a fleet of native workers behind
`mtpstack proxy` (`fleet`, `start_fleet`), nginx as the front end compared with it (`nginx_conf`), the raw
clients that time them (`plain`, `stream`) and the CPU their processes use (`cpu_seconds`). The servers
of one worker are `mtpstack.bench.servers`."""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from mtpstack.bench.servers import start_workers, worker_profile
from mtpstack.runtime import Processes, url_of
from mtpstack.validator import FleetConfig, worker_argv
from mtpstack.worker.launcher import resolve_command

#: A fleet's queue and first-byte limits: long enough for a widened target's slowest turn.
FLEET_TIMEOUT = 900


# -- fleets -------------------------------------------------------------------------------------

def fleet(policy: str, target: Path, head: Path, width: int, depth: int, ports: dict[str, int], proxy_port: int) -> dict:
    return {
        "proxy": {"port": proxy_port, "routing": policy, "modelConcurrencyLimits": {"bench": width},
                  "queue": {"maxWaiting": 64, "timeoutSeconds": FLEET_TIMEOUT}, "timeouts": {"firstByteSeconds": FLEET_TIMEOUT}},
        "workers": {name: worker_profile(target, head, depth, port, width=width) for name, port in ports.items()},
    }


def start_fleet(data: dict, rundir: Path):
    """The workers, then the proxy once they are healthy: (all processes, the proxy, the workers)."""
    rundir.mkdir(parents=True, exist_ok=True)
    (rundir / "fleet.yaml").write_text(yaml.safe_dump(data))
    config, procs = FleetConfig.model_validate(data), Processes()
    workers = start_workers({name: (resolve_command(worker_argv(w)), w.port) for name, w in config.workers.items()},
                            rundir, procs, timeout=600)
    try:
        proxy = procs.start([sys.executable, "-m", "mtpstack", "proxy", "--config", str(rundir / "fleet.yaml")],
                            log_path=rundir / "proxy.log", name="proxy", kind="proxy", url=url_of("127.0.0.1", data["proxy"]["port"]))
        proxy.wait_ready("/readyz", 60)
    except BaseException:
        procs.stop_all()
        raise
    return procs, proxy, list(workers.values())


# -- front ends ----------------------------------------------------------------------------------

def nginx_conf(workdir: Path, routes: dict[int, int | list[int]], read_timeout_s: int | None = None) -> str:
    """One process, no buffering either way, keep-alive to the upstream, an access log like the proxy's.
    `routes`: listening port -> upstream port, or several (nginx's default round-robin among them).
    `read_timeout_s`: `proxy_read_timeout` (nginx's default, 60 s, cuts a model's longer prefill)."""
    upstreams, servers = [], []
    read_timeout = f"\n      proxy_read_timeout {read_timeout_s}s;" if read_timeout_s else ""
    for listen, upstream in routes.items():
        members = " ".join(f"server 127.0.0.1:{port};" for port in ([upstream] if isinstance(upstream, int) else upstream))
        upstreams.append(f"  upstream u{listen} {{ {members} keepalive 16; }}")
        servers.append(f"""  server {{
    listen 127.0.0.1:{listen};
    location / {{
      proxy_pass http://u{listen};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;{read_timeout}
    }}
  }}""")
    temp = workdir / "nginx-temp"
    temp.mkdir(exist_ok=True)
    temps = "\n".join(f"  {kind}_temp_path {temp}/{folder};" for kind, folder in (
        ("client_body", "body"), ("proxy", "proxy"), ("fastcgi", "fastcgi"), ("uwsgi", "uwsgi"), ("scgi", "scgi")))
    return "\n".join([f"""daemon off;
master_process off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log {workdir}/nginx-access.log;
{temps}""", *upstreams, *servers, "}"])


# -- clients and probes ----------------------------------------------------------------------

@dataclass
class Sample:
    latency: list[float] = field(default_factory=list)  # plain: full answer; sse: whole stream
    first_chunk: list[float] = field(default_factory=list)  # sse only
    #: stamped streams: per chunk, arrival here minus the upstream's send time
    chunk_delay: list[float] = field(default_factory=list)
    errors: int = 0


_STAMP = re.compile(rb'"t":([0-9.]+)')


async def plain(session: aiohttp.ClientSession, url: str, body: bytes, s: Sample) -> None:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        await r.read()
        if r.status != 200:
            s.errors += 1
            return
    s.latency.append(time.perf_counter() - t0)


async def stream(session: aiohttp.ClientSession, url: str, body: bytes, s: Sample, stamped: bool = False) -> None:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            await r.read()
            s.errors += 1
            return
        chunk = await r.content.readany()
        t1, tail = time.perf_counter(), b""
        while chunk:
            if stamped:
                # Delivery delay of each chunk: our arrival time minus the upstream's send time
                # (both CLOCK_MONOTONIC), independent of how regularly the upstream paces.
                now = time.monotonic()
                s.chunk_delay.extend(now - float(m) for m in _STAMP.findall(chunk))
            tail = (tail + chunk)[-32:]
            chunk = await r.content.readany()
    if not tail.endswith(b"data: [DONE]\n\n"):
        s.errors += 1
        return
    s.first_chunk.append(t1 - t0)
    s.latency.append(time.perf_counter() - t0)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` so far: schedstat (ns) if the kernel has it, else stat (ticks)."""
    total, found = 0, False
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
                    found = True
            except (FileNotFoundError, ProcessLookupError):
                continue
    except FileNotFoundError:
        pass
    if found:
        return total / 1e9
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
