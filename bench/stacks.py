"""Whole stacks for the benches that measure past one worker: a fleet of native workers behind
`mtpstack proxy` (`start_fleet`), nginx as the front end compared with it (`start_nginx`), the raw
clients that time them (`plain`, `stream`) and the CPU their processes use (`cpu_seconds`)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from mtpstack.bench.conversations import REQUEST_TIMEOUT
from mtpstack.bench.servers import start_workers, worker_command, worker_profile
from mtpstack.runtime import Process, Processes, free_port, url_of
from mtpstack.validator import FleetConfig


# -- fleets -------------------------------------------------------------------------------------

def start_fleet(policy: str, target: Path, head: Path, width: int, depth: int, backends: int, rundir: Path,
                **proxy_fields) -> tuple[Processes, Process, list[Process]]:
    """`backends` workers (w0, w1, ...), then the proxy once they are healthy, its queue and first-byte limits
    a turn's (`REQUEST_TIMEOUT`): (all processes, the proxy, the workers)."""
    port = free_port()
    workers = {f"w{i}": worker_profile(target, head, depth, free_port(), width=width) for i in range(backends)}
    data = {"proxy": {"port": port, "routing": policy, "modelConcurrencyLimits": {"bench": width},
                      "queue": {"maxWaiting": 64, "timeoutSeconds": REQUEST_TIMEOUT},
                      "timeouts": {"firstByteSeconds": REQUEST_TIMEOUT}, **proxy_fields}, "workers": workers}
    FleetConfig.model_validate(data)  # a bad proxy field fails here, not after the workers have loaded
    rundir.mkdir(parents=True, exist_ok=True)
    (rundir / "fleet.yaml").write_text(yaml.safe_dump(data))
    procs = Processes()
    started = start_workers({name: (worker_command(w), w["port"]) for name, w in workers.items()}, rundir, procs,
                            timeout=600)
    try:
        proxy = procs.start([sys.executable, "-m", "mtpstack", "proxy", "--config", str(rundir / "fleet.yaml")],
                            log_path=rundir / "proxy.log", name="proxy", kind="proxy", url=url_of("127.0.0.1", port))
        proxy.wait_ready("/readyz", 60)
    except BaseException:
        procs.stop_all()
        raise
    return procs, proxy, list(started.values())


# -- nginx ---------------------------------------------------------------------------------------

def nginx_program() -> str | None:
    """nginx's executable (Debian's nginx-light puts it in /usr/sbin, often off PATH), None if not installed."""
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def nginx_version(program: str | None) -> str | None:
    return subprocess.run([program, "-v"], capture_output=True, text=True).stderr.strip() if program else None


def nginx_conf(workdir: Path, routes: dict[int, int | list[int]], read_timeout_s: int | None = None) -> str:
    """One process, no buffering either way, keep-alive to the upstream, an access log like the proxy's.
    `routes`: listening port -> upstream port, or several (nginx's default round-robin among them).
    `read_timeout_s`: `proxy_read_timeout` (nginx's default, 60 s, cuts a model's longer prefill)."""
    upstreams, servers = [], []
    read_timeout = f"\n      proxy_read_timeout {read_timeout_s}s;" if read_timeout_s else ""
    for listen, upstream in routes.items():
        members = " ".join(f"server 127.0.0.1:{p};" for p in ([upstream] if isinstance(upstream, int) else upstream))
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
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temps = "\n".join(f"  {kind}_temp_path {temp}/{kind};" for kind in kinds)
    return "\n".join([f"""daemon off;
master_process off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log {workdir}/nginx-access.log;
{temps}""", *upstreams, *servers, "}"])


def start_nginx(procs: Processes, program: str, workdir: Path, routes: dict[int, int | list[int]], *,
                read_timeout_s: int | None = None, name: str = "nginx", cwd: Path | None = None) -> Process:
    """nginx over `routes` (`nginx_conf`), started among `procs`, its URL the first route's; not yet waited for."""
    (workdir / "nginx.conf").write_text(nginx_conf(workdir, routes, read_timeout_s))
    return procs.start([program, "-c", str(workdir / "nginx.conf"), "-p", str(workdir)], name=name, kind="proxy",
                       log_path=workdir / f"{name}.log", url=url_of("127.0.0.1", next(iter(routes))), cwd=cwd)


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
            if stamped:  # both clocks CLOCK_MONOTONIC: the delay whatever the upstream's pacing
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
    """CPU time of every thread of `pid` so far: schedstat (ns) if the kernel has it, else stat (ticks). Raises
    FileNotFoundError once the process is gone."""
    total, found = 0, False
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that has just ended
            total, found = total + int(path.read_text().split()[0]), True
    if found:
        return total / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
