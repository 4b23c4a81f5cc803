"""Child processes, the one way: start, wait until ready, stop, read the log's tail.

Used by `mtpstack up`, `mtpstack bench sweep`, the benchmark scripts and the tests. Guarantees:

- a process starts in its own process group (a new session), stdin closed, its output
  appended to its log file; so `stop` reaches every child it forks, and a terminal's Ctrl-C
  reaches only the parent that started it;
- `stop` sends SIGTERM to the group, then SIGKILL to the group once `timeout` passes, and
  returns the exit code; it is a no-op on a process that already ended;
- `wait_ready` returns once the URL answers 200, or raises `StartError` whose message names
  the process and ends with its log tail, when the process exits first or `timeout` passes.

Base layer: the standard library only, nothing from other mtpstack packages.
"""

from __future__ import annotations

import json
import os
import signal as _signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

#: How often readiness is polled; a worker loads tiny models in well under a second.
POLL_INTERVAL = 0.2
#: Per-poll HTTP timeout; a health endpoint never does work, so a slow answer means a busy machine.
POLL_TIMEOUT = 2.0
#: Lines of the log shown when a start fails.
TAIL_LINES = 20

#: One raw log line -> the text a person reads (`mtpstack up` renders JSON log lines as plain text).
LineRenderer = Callable[[str], str]


# -- addresses ------------------------------------------------------------------------------
#: Bind addresses that listen on every interface, and the loopback address each is reached at. `::`
#: maps to `::1`, not 127.0.0.1: an aiohttp listener on `::` sets IPV6_V6ONLY and does not accept IPv4.
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "*": "127.0.0.1", "": "127.0.0.1"}


def connect_host(host: str) -> str:
    """The address to connect to for a service bound to `host`: a wildcard bind is reached on loopback.
    The only place that maps wildcard addresses; everything that builds a URL goes through `url_of`."""
    return WILDCARD_HOSTS.get(host, host)


def url_of(host: str, port: int) -> str:
    """`http://HOST:PORT` for a service bound to `host`, IPv6 addresses in brackets."""
    h = connect_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on `host`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive TCP ports that were all free a moment ago on `host` (a
    distributed worker's rank ports are `basePort + rank`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(100):
        base = free_port(host)
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket(family, socket.SOCK_STREAM)
                held.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue  # one of them is taken: try another base
        finally:
            for s in held:
                s.close()
    raise OSError(f"found no {count} consecutive free ports on {host}")


def http_status(url: str, timeout: float = POLL_TIMEOUT, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """(status, JSON object body) of GET `url`; (0, {}) when nothing answers, {} for a body that is not a JSON object."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        body, status = e.read(), e.code
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = {}
    return status, parsed if isinstance(parsed, dict) else {}


# -- logs -----------------------------------------------------------------------------------
def log_tail(path: Path, lines: int = TAIL_LINES) -> list[str] | None:
    """The last `lines` lines of a log, raw, without their line ends; None when there is no log."""
    try:
        f = Path(path).open("rb")
    except FileNotFoundError:
        return None
    with f:
        # Read back from the end, not through the whole file: `up` polls this while a process starts,
        # and a run directory's logs grow across runs and restarts.
        pos = f.seek(0, 2)
        data, block = b"", 8192
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
            block *= 2
    found = data.decode("utf-8", errors="replace").split("\n")
    if found[-1] == "":
        found.pop()  # the end of the last line, not a line
    return found[-lines:] if lines > 0 else []


def tail_text(path: Path, lines: int = TAIL_LINES, render: LineRenderer | None = None) -> str:
    """The log tail as shown to a person: each line through `render` (default: as written), `(no log)` when there is none."""
    raw = log_tail(path, lines)
    if raw is None:
        return "(no log)"
    return "\n".join(raw if render is None else (render(line) for line in raw)).rstrip("\n")


# -- signals --------------------------------------------------------------------------------
def signal_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group led by `pid`, else to `pid` alone; a process already gone is not an error."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- processes ------------------------------------------------------------------------------
class StartError(Exception):
    """A process did not become ready: it exited first (`exit_code` set) or `timeout` passed (`exit_code` None).
    The message names the process and ends with its log tail."""

    def __init__(self, message: str, process: Process, exit_code: int | None):
        super().__init__(message)
        self.message = message
        self.process = process
        self.exit_code = exit_code

    @property
    def exited(self) -> bool:
        """The process exited before it was ready (else: the wait timed out)."""
        return self.exit_code is not None


class Process:
    """One child process, started by `start` in its own process group with its output appended to `log_path`.

    `kind` and `name` name it in messages (`worker `w0``); `url` is where the service it runs (or
    starts) answers, for `wait_ready`. `stdout_path`, when given, keeps stdout apart from the log.
    `render_log` turns each raw log line into the text a person reads in `log_text`.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        name: str = "process",
        kind: str = "process",
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        stdout_path: Path | None = None,
        render_log: LineRenderer | None = None,
    ):
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.name = name
        self.kind = kind
        self.url = url
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.stdout_path = Path(stdout_path) if stdout_path is not None else None
        self.render_log = render_log
        self.pid: int | None = None
        self.started_at: float | None = None
        self._popen: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"<Process {self.kind} `{self.name}` pid {self.pid}>"

    @property
    def label(self) -> str:
        return f"{self.kind} `{self.name}`"

    def start(self) -> Process:
        if self._popen is not None:
            raise RuntimeError(f"{self.label} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            out = self.stdout_path.open("ab") if self.stdout_path is not None else None
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out if out is not None else log,
                    stderr=log if out is not None else subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            finally:
                if out is not None:
                    out.close()
        self.pid = self._popen.pid
        self.started_at = time.time()
        return self

    @property
    def started(self) -> bool:
        return self._popen is not None

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The exit code once the process ended (negative: the signal that ended it), else None."""
        return None if self._popen is None else self._popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end; raises `subprocess.TimeoutExpired` after `timeout`."""
        self._require_started()
        return self._popen.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        """Send `sig` to the process group (to the process alone if its group is gone)."""
        if self.alive():
            signal_group(self._popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group, without waiting."""
        self.signal(_signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `timeout`; return the exit code (None if never started)."""
        if self._popen is None:
            return None
        if self._popen.poll() is None:
            signal_group(self._popen.pid, _signal.SIGTERM)
            try:
                self._popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                signal_group(self._popen.pid, _signal.SIGKILL)
                self._popen.wait(timeout=timeout)
        return self._popen.returncode

    def interrupt(self, timeout: float = 30.0) -> int | None:
        """SIGINT the process group, as Ctrl-C does, and give it `timeout` to shut down cleanly before
        `stop`; return the exit code (None if never started)."""
        if self._popen is None:
            return None
        self.signal(_signal.SIGINT)
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return self.stop()

    def log_text(self, lines: int = TAIL_LINES) -> str:
        """The log's tail as a person reads it (see `tail_text`)."""
        return tail_text(self.log_path, lines, self.render_log)

    def ready(self, path: str) -> bool:
        """GET `url + path` answers 200."""
        return http_status(self._ready_url(path))[0] == 200

    def wait_ready(self, path: str = "/health", timeout: float = 120.0, *, state: str = "ready",
                   on_tick: Callable[[float], None] | None = None) -> None:
        """Poll GET `url + path` until 200; `StartError` if the process exits first or `timeout` passes.
        `state` is the word the error uses (`... before it was healthy`)."""
        wait_all_ready([(self, path)], timeout, state=state, on_tick=on_tick)

    def exited_error(self, state: str = "ready") -> StartError:
        code = self.exit_code
        return StartError(
            f"{self.label} exited with code {code} before it was {state}\n\nlog tail ({self.log_path}):\n{self.log_text()}",
            self, code,
        )

    def timeout_error(self, path: str, timeout: float, state: str = "ready") -> StartError:
        return StartError(
            f"{self.label} not {state} after {timeout:g} s at {self._ready_url(path)}\n\n"
            f"log tail ({self.log_path}):\n{self.log_text()}",
            self, None,
        )

    def _ready_url(self, path: str) -> str:
        if self.url is None:
            raise RuntimeError(f"{self.label} has no url to poll")
        return self.url + path

    def _require_started(self) -> None:
        if self._popen is None:
            raise RuntimeError(f"{self.label} not started")


def wait_all_ready(
    items: Sequence[tuple[Process, str]],
    timeout: float,
    *,
    state: str = "ready",
    on_tick: Callable[[float], None] | None = None,
    on_ready: Callable[[Process], None] | None = None,
) -> None:
    """Poll every (process, path) until its `url + path` answers 200, calling `on_ready(process)` as each
    does. `StartError` for the first process that exits, or for the first still pending once `timeout`
    passes. `on_tick(elapsed)` runs between polls (it may raise to give up)."""
    for p, _ in items:
        p._require_started()
    pending = list(items)
    start = time.monotonic()
    while True:
        for item in list(pending):
            p, path = item
            if not p.alive():
                raise p.exited_error(state)
            if p.ready(path):
                pending.remove(item)
                if on_ready is not None:
                    on_ready(p)
        if not pending:
            return
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            p, path = pending[0]
            raise p.timeout_error(path, timeout, state)
        if on_tick is not None:
            on_tick(elapsed)
        time.sleep(POLL_INTERVAL)


class Processes:
    """Processes started together and stopped together, the last started first: what a bench or a
    test fixture runs, all of it stopped at exit (Ctrl-C too)."""

    def __init__(self) -> None:
        self.started: list[Process] = []

    def start(self, argv: Sequence[str], **kw) -> Process:
        p = Process(argv, **kw).start()
        self.started.append(p)
        return p

    def stop_all(self, timeout: float = 10.0) -> None:
        for p in reversed(self.started):
            try:
                p.stop(timeout=timeout)
            except Exception:  # noqa: BLE001 - at exit, keep stopping the rest
                p.kill()
