"""`mtpstack up`: bring the whole stack up from one config, keep it up, take it down in order.

Validate first; start every worker as its own process with its weights on its command line
(`validator.worker_argv` through `mtpstack.worker.launcher`, the same argv the Nix units run); wait
until each `/health` answers 200; then start the proxy and wait for `/readyz`. While running,
a process that exits unexpectedly is restarted with backoff (the proxy routes around a
missing worker meanwhile). SIGINT or SIGTERM stops the proxy first, then the workers.

A fleet placed on hosts (`deployOn`) runs here only the parts placed on this machine: the
host named by `--host`, else the declared host whose name is this machine's. The other parts
are recorded in `state.json` by the address they are reached at, for `mtpstack status`. When
every declared host's address is a loopback address, the fleet is one machine's and runs whole.

A worker that spans hosts (`distributed`) runs one process per rank placed here, each with the
environment `mlx.launch` would give it (`mtpstack.worker.launcher.rank_environments`); rank 0
answers `/health` once every rank has joined and loaded. When one rank exits, its siblings here
are stopped too and all restart together, as the worker is one.

Everything a run leaves lives in the run directory: the effective config (`fleet.json`, local
model paths made absolute), one log per process, `state.json`, which `mtpstack status`
reads, and the disk tier of each native worker's prefix cache whose config names no
`prefixCache.dir` (`prefix-cache/<worker>`), which the next run resumes from.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mtpstack.errors import UserError, print_error
from mtpstack.banner import ready_banner
from mtpstack.logs import render_line
from mtpstack.runtime import Process, StartError, http_status, log_tail, url_of, wait_all_ready
from mtpstack.validator import (
    DEPTH_AUTO,
    FleetConfig,
    WorkerProfile,
    did_you_mean,
    display_name,
    is_loopback,
    is_placed,
    load_config,
    local_dir,
    parts_on,
    rank_on,
    rank_peers,
    validate_data,
    worker_argv,
)
from mtpstack.worker.launcher import rank_environments, resolve_command, worker_env

DEFAULT_RUN_DIR = Path(".mtpstack/run")
DEMO_MODEL = "mtpstack-demo"
#: Restart backoff for a process that exits unexpectedly: 1, 2, 4, ... capped here.
MAX_BACKOFF_SECONDS = 30.0
#: A process that stayed up this long has its backoff reset.
STABLE_AFTER_SECONDS = 60.0
#: How often the supervisor looks at its processes.
SUPERVISE_INTERVAL = 0.25


class UpError(UserError):
    """`mtpstack up` cannot start or keep the stack up."""


def default_fleet() -> dict:
    """The bundled demo: the shipped hybrid target with its MTP head on one worker, the proxy in front, coupled at 2."""
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    return {
        "proxy": {"host": "127.0.0.1", "port": 8080, "modelConcurrencyLimits": {DEMO_MODEL: 2}},
        "workers": {
            "demo": {
                "model": DEMO_MODEL,
                "target": {"path": str(DEMO_TARGET), "bits": "fp32"},
                "drafter": {"path": str(DEMO_HEAD), "bits": "fp32", "depth": DEPTH_AUTO, "kind": "mtp"},
                "maxNumSeqs": 2,
                "host": "127.0.0.1",
                "port": 8101,
            }
        },
    }


def effective_config(config_file: Path | None) -> tuple[FleetConfig, dict]:
    """Validate and return the config plus its plain data, local model paths made absolute
    (relative to the config file's folder) so every process reads the same file the same way."""
    if config_file is None:
        data = default_fleet()
        config, report = validate_data(data, "<bundled demo fleet>")
    else:
        config, report = load_config(config_file)
        if config is not None:
            data = config.model_dump(mode="json", by_alias=True)
    if config is None or not report.ok:
        text = report.render_text()
        n = len(report.errors)
        raise UpError(
            (text + "\n" if text else "") + f"not starting: the config has {n} error{'s' * (n != 1)}",
            f"check it with `mtpstack validate {config_file}`" if config_file else None,
        )
    base = config_file.resolve().parent if config_file else Path.cwd()
    for worker in data["workers"].values():
        for role in ("target", "drafter"):
            spec = worker.get(role)
            if spec and (found := local_dir(spec["path"], base)) is not None:
                spec["path"] = str(found)
    config, report = validate_data(data, str(config_file))
    assert config is not None and report.ok, report.render_text()
    return config, data


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def this_host(config: FleetConfig, chosen: str | None, machine: str | None = None) -> str | None:
    """The host whose parts run here: `chosen` (`--host`), else the declared host named like this
    machine (its full name or the part before the first dot); None when nothing is placed."""
    declared = list(config.hosts)
    listed = ", ".join(f"`{display_name(h)}`" for h in declared) or "none"
    if chosen is not None:
        if chosen not in config.hosts:
            guess = did_you_mean(chosen, declared)
            raise UpError(
                f"no host `{display_name(chosen)}` is declared under `hosts` (declared: {listed})",
                f"did you mean `--host {guess}`?" if guess else "pass the name of a declared host",
            )
        return chosen
    if not is_placed(config):
        return None
    if config.hosts and all(is_loopback(h.address) for h in config.hosts.values()):
        return None  # every host is this machine: run every part, every rank
    machine = machine or socket.gethostname()
    for name in (machine, machine.split(".")[0]):
        if name in config.hosts:
            return name
    raise UpError(
        f"the fleet is placed on hosts ({listed}) but this machine's name is none of them: `{display_name(machine)}`",
        "pass `--host NAME` to run that host's parts here",
    )


def remote_parts(config: FleetConfig, host: str | None) -> dict[str, dict]:
    """The parts that run on other hosts, by name (`proxy` or `worker NAME`), with where they are reached."""
    if host is None:
        return {}
    with_proxy, names = parts_on(config, host)
    remote: dict[str, dict] = {}
    p = config.proxy
    if not with_proxy and p.deploy_on is not None:
        remote["proxy"] = {"kind": "proxy", "remote": True, "host": p.deploy_on, "url": url_of(config.hosts[p.deploy_on].address, p.port)}
    for name, w in config.workers.items():
        if name not in names and w.home is not None:
            remote[name] = {"kind": "worker", "remote": True, "model": w.model, "host": w.home, "url": url_of(config.hosts[w.home].address, w.port)}
    return remote


@dataclass
class Managed:
    """One supervised process: a worker or the proxy."""

    name: str
    kind: str  # "worker" | "proxy"
    argv: list[str]
    host: str
    port: int
    log_path: Path
    ready_path: str
    model: str | None = None
    #: A rank of a distributed worker: its rank and what `mlx.launch` would add to its environment.
    rank: int | None = None
    rank_env: dict[str, str] = field(default_factory=dict)
    #: The worker a rank belongs to: its ranks here restart together.
    group: str | None = None
    process: Process | None = None
    restarts: int = 0
    next_start: float = 0.0
    history: list[dict] = field(default_factory=list)

    @property
    def url(self) -> str:
        return url_of(self.host, self.port)

    def start(self, env: dict[str, str]) -> None:
        # readiness (`ready_path`: /health of a worker, /readyz of the proxy) is polled by `Stack._wait_all`;
        # its log lines (JSON from our services) are rendered as plain text wherever a person reads them
        self.process = Process(self.argv, log_path=self.log_path, name=self.name, kind=self.kind, url=self.url,
                               env={**env, **self.rank_env}, render_log=render_line).start()
        self.history.append({"pid": self.process.pid, "started_at": self.process.started_at})

    def state(self) -> dict:
        p = self.process
        return {
            "kind": self.kind,
            "model": self.model,
            "pid": p.pid if p else None,
            "started_at": p.started_at if p else None,
            "url": self.url,
            "log": str(self.log_path),
            "argv": self.argv,
            "restarts": self.restarts,
            **({"rank": self.rank} if self.rank is not None else {}),
        }


class Stack:
    """The processes of one `mtpstack up` run, and the loop that keeps them up."""

    def __init__(self, config: FleetConfig, run_dir: Path, *, health_timeout: float, host: str | None = None, out=sys.stderr):
        self.config = config
        self.host = host
        with_proxy, local_workers = parts_on(config, host)
        self.remote = remote_parts(config, host)
        self.run_dir = run_dir
        self.health_timeout = health_timeout
        self.out = out
        self.stopping = threading.Event()
        self.env = worker_env()
        self.config_path = run_dir / "fleet.json"
        logs = run_dir / "logs"
        self.workers: list[Managed] = []  # each worker's HTTP side (rank 0 of a distributed one)
        self.ranks: list[Managed] = []  # the other ranks here of distributed workers
        for name, w in config.workers.items():
            if name not in local_workers:
                continue
            plain = Managed(name=name, kind="worker", argv=resolve_command(worker_argv(self.with_cache_dir(name, w))),
                            host=w.host, port=w.port,
                            log_path=logs / f"worker-{name}.log", ready_path="/health", model=w.model)
            if w.distributed is None:
                self.workers.append(plain)
            else:
                self._add_ranks(name, w, plain, logs)
        p = config.proxy
        self.proxy = None if not with_proxy else Managed(
            name="proxy",
            kind="proxy",
            argv=resolve_command(["mtpstack", "proxy", "--config", str(self.config_path)]),
            host=p.host,
            port=p.port,
            log_path=logs / "proxy.log",
            ready_path="/readyz",
        )

    def context_windows(self) -> dict[str, int]:
        """The context each served model has here, in tokens: the smallest of its ready workers' (`/identity`
        `context_length`: the model's own maximum, or `maxContextTokens` when lower). A model whose workers
        do not say is left out."""
        windows: dict[str, int] = {}
        for m in self.workers:
            _, ident = http_status(m.url + "/identity")
            ctx = ident.get("context_length")
            if m.model is not None and isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0:
                windows[m.model] = min(ctx, windows.get(m.model, ctx))
        return windows

    def with_cache_dir(self, name: str, w: WorkerProfile) -> WorkerProfile:
        """A native worker without `prefixCache.dir` keeps its disk tier in this run directory,
        `prefix-cache/<worker>`, so a conversation's cache outlives a restart of `mtpstack up`."""
        if w.backend != "native" or w.prefix_cache.dir is not None:
            return w
        cache = w.prefix_cache.model_copy(update={"dir": str(self.run_dir / "prefix-cache" / name)})
        return w.model_copy(update={"prefix_cache": cache})

    def _add_ranks(self, name: str, w: WorkerProfile, plain: Managed, logs: Path) -> None:
        peers = rank_peers(self.config, name)
        envs = rank_environments(peers, w.distributed.backend, self.run_dir / f"hostfile-{name}.json", w.distributed.ibv_devices)
        here = range(len(peers)) if self.host is None else [rank_on(w, self.host)]
        for r in here:
            if r == 0:
                plain.rank, plain.rank_env, plain.group = 0, envs[0], name
                self.workers.append(plain)
                continue
            address, port = peers[r].rsplit(":", 1)
            # No HTTP side: rank 0's /health answers for every rank (it loads after all have joined).
            self.ranks.append(Managed(name=f"{name}-rank{r}", kind="worker", argv=plain.argv, host=address, port=int(port),
                                      log_path=logs / f"worker-{name}-rank{r}.log", ready_path="", model=w.model,
                                      rank=r, rank_env=envs[r], group=name))

    # -- state file -------------------------------------------------------------------------
    def write_state(self, phase: str) -> None:
        state = {
            "phase": phase,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "config": str(self.config_path),
            "host": self.host,
            "proxy": self.proxy.state() if self.proxy else self.remote.get("proxy"),
            "workers": {m.name: m.state() | self._ranks_of(m) for m in self.workers}
            | {n: part for n, part in self.remote.items() if part["kind"] == "worker"},
        }
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.run_dir / "state.json")

    def _ranks_of(self, m: Managed) -> dict:
        ranks = [r.state() for r in self.ranks if r.group == m.name and m.group is not None]
        return {"ranks": ranks} if ranks else {}

    # -- start ------------------------------------------------------------------------------
    @property
    def local(self) -> list[Managed]:
        """The processes this run starts: this host's workers and ranks, then the proxy if it runs here."""
        return [*self.ranks, *self.workers, *([self.proxy] if self.proxy else [])]

    def check_ports(self) -> None:
        for m in self.local:
            if not port_is_free(m.host, m.port):
                where = "proxy.port" if m.kind == "proxy" else f"workers.{m.group}.distributed.basePort" if m.rank else f"workers.{m.name}.port"
                raise UpError(
                    f"port {m.port} on `{m.host}` is already in use; `{m.name}` cannot listen there",
                    f"stop what uses it (another `mtpstack up`? see `mtpstack status`), or change `{where}`",
                )

    def start(self) -> None:
        self.started_at = time.time()
        self.check_ports()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for m in [*self.ranks, *self.workers]:
            m.start(self.env)
        self.write_state("starting")
        self._wait_all(self.workers)
        if self.proxy is not None:
            self.proxy.start(self.env)
            self.write_state("starting")
            self._wait_all([self.proxy])
        self.write_state("running")

    def _wait_all(self, items: list[Managed]) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(file=self.out, no_color="NO_COLOR" in os.environ)
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True,
            disable=not console.is_terminal,  # no spinner, and no blank line it leaves, in a log or a pipe
        ) as progress:
            items = [m for m in items if m.ready_path]  # a rank beyond 0 is ready when rank 0 is
            tasks = {m.name: progress.add_task(f"starting {m.kind} `{m.name}` ({m.url})") for m in items}

            ready: set[str] = set()

            def on_ready(p: Process) -> None:
                ready.add(p.name)
                progress.update(tasks[p.name], description=f"{p.kind} `{p.name}` ready at {p.url}")
                console.print(f"{p.kind} `{p.name}` ready at {p.url} (pid {p.pid})")

            def on_tick(elapsed: float) -> None:
                if self.stopping.is_set():
                    raise KeyboardInterrupt
                for m in items:  # what each process still starting is doing: its latest log line, as text
                    latest = log_tail(m.log_path, 1) if m.name not in ready else None
                    if latest:
                        doing = render_line(latest[-1]).partition("\n")[0]
                        progress.update(tasks[m.name], description=escape(f"starting {m.kind} `{m.name}` ({m.url}): {doing}"))

            on_tick(0.0)
            try:
                wait_all_ready([(m.process, m.ready_path) for m in items], self.health_timeout, on_tick=on_tick, on_ready=on_ready)
            except StartError as e:
                hint = (f"the whole log is at `{e.process.log_path}`" if e.exited
                        else "raise `--health-timeout` if loading the model takes longer")
                raise UpError(e.message, hint) from None

    # -- run --------------------------------------------------------------------------------
    def supervise(self) -> None:
        """Restart any process that exits unexpectedly, with backoff, until asked to stop."""
        while not self.stopping.wait(SUPERVISE_INTERVAL):
            for m in self.local:
                p = m.process
                if p is not None and p.alive():
                    if m.restarts and time.time() - (p.started_at or 0) > STABLE_AFTER_SECONDS:
                        m.restarts = 0
                    continue
                now = time.monotonic()
                if p is not None:  # it just died: schedule the restart
                    code = p.stop(timeout=1)
                    self._stop_siblings(m)
                    delay = min(MAX_BACKOFF_SECONDS, 2.0 ** m.restarts)
                    m.restarts += 1
                    m.process = None
                    m.next_start = now + delay
                    self.say(f"{m.kind} `{m.name}` exited with code {code}; restarting in {delay:g} s (restart {m.restarts})")
                    self.write_state("running")
                elif now >= m.next_start:
                    if not port_is_free(m.host, m.port):
                        m.next_start = now + 1.0
                        continue
                    m.start(self.env)
                    self.say(f"{m.kind} `{m.name}` restarted (pid {m.process.pid})")
                    self.write_state("running")

    def _stop_siblings(self, m: Managed) -> None:
        """A rank exited: the worker is one, so its other ranks here stop too and restart with it."""
        if m.group is None:
            return
        for other in self.local:
            if other is not m and other.group == m.group and other.process is not None and other.process.alive():
                other.process.stop(timeout=5)  # the supervisor sees it exited and schedules its restart

    def stop(self) -> None:
        """Proxy first (it drains in-flight requests), then the workers."""
        grace = self.config.proxy.shutdown_grace_seconds + 5
        if self.proxy is not None and self.proxy.process is not None:
            self.proxy.process.stop(timeout=grace)
        for m in [*self.workers, *self.ranks]:
            if m.process is not None:
                m.process.stop(timeout=10)
        if self.run_dir.exists():
            self.write_state("stopped")

    def say(self, text: str) -> None:
        print(f"up: {text}", file=self.out, flush=True)


def run_up(config_file: Path | None, run_dir: Path, health_timeout: float, host: str | None = None) -> int:
    try:
        config, data = effective_config(config_file)
        host = this_host(config, host)
    except UpError as e:
        return print_error(e)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "fleet.json").write_text(json.dumps(data, indent=2))
    stack = Stack(config, run_dir.resolve(), health_timeout=health_timeout, host=host)

    def on_signal(signum, frame):
        stack.stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        stack.start()
        print(ready_banner(config, host, stack.context_windows()), flush=True)
        stack.supervise()
        stack.say("stopping: proxy first, then workers")
    except KeyboardInterrupt:
        stack.say("interrupted while starting; stopping what was started")
        code = 130
    except UpError as e:
        print_error(e)
        code = 1
    finally:
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == 0:
        stack.say("stopped")
    return code
