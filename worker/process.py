"""A started worker process: its own process group, its log, its health.

Reused by `mtpstack up` and the bench; the argv comes from
`launcher.resolve_command(validator.worker_argv(profile))`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

#: How often `wait_healthy` polls; a worker loads tiny models in well under a second.
POLL_INTERVAL = 0.2
#: Per-poll HTTP timeout; /health never does work, so a slow answer means a busy machine.
POLL_TIMEOUT = 2.0


class WorkerStartError(Exception):
    """A worker did not become healthy. The message names the worker and includes its log tail."""


class WorkerProcess:
    def __init__(
        self,
        argv: list[str],
        *,
        host: str,
        port: int,
        log_path: Path,
        name: str = "worker",
        env: Mapping[str, str] | None = None,
    ):
        self.argv = list(argv)
        self.host = host
        self.port = port
        self.log_path = Path(log_path)
        self.name = name
        self.env = dict(env) if env is not None else None
        self.pid: int | None = None
        self.started_at: float | None = None
        self._proc: subprocess.Popen | None = None
        url_host = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
        self.url = f"http://[{url_host}]:{port}" if ":" in url_host else f"http://{url_host}:{port}"

    def start(self) -> None:
        """Start in its own process group (so `stop` reaches its children), output appended to the log."""
        if self._proc is not None:
            raise RuntimeError(f"{self.name} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.pid = self._proc.pid
        self.started_at = time.time()

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def health(self, timeout: float = POLL_TIMEOUT) -> tuple[int, dict]:
        """(status, body) of GET /health; (0, {}) when nothing answers."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout) as resp:
                return resp.status, _json(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, _json(e.read())
        except (urllib.error.URLError, OSError, ValueError):
            return 0, {}

    def wait_healthy(self, timeout: float = 120.0, on_tick: Callable[[float], None] | None = None) -> None:
        """Poll GET /health until 200. Raises `WorkerStartError` if the process exits or `timeout` passes."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} not started")
        start = time.monotonic()
        while True:
            elapsed = time.monotonic() - start
            if not self.alive():
                code = self._proc.returncode
                raise WorkerStartError(
                    f"worker `{self.name}` exited with code {code} before it was healthy\n\n"
                    f"log tail ({self.log_path}):\n{self.log_tail()}"
                )
            status, _ = self.health()
            if status == 200:
                return
            if elapsed > timeout:
                raise WorkerStartError(
                    f"worker `{self.name}` not healthy after {timeout:g} s at {self.url}/health\n\n"
                    f"log tail ({self.log_path}):\n{self.log_tail()}"
                )
            if on_tick is not None:
                on_tick(elapsed)
            time.sleep(POLL_INTERVAL)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `timeout`; return the exit code."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self._proc.wait(timeout=timeout)
        return self._proc.returncode

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self._proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                self._proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def log_tail(self, lines: int = 20) -> str:
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as f:
                return "".join(deque(f, maxlen=lines)).rstrip("\n")
        except FileNotFoundError:
            return "(no log)"


def _json(raw: bytes) -> dict:
    try:
        value = json.loads(raw.decode("utf-8"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
