"""A fleet of fake workers (`devkit.fake_upstream` processes, which count their own concurrency and
refuse above their gate) behind a real `mtpstack proxy` process, written as one fleet config.

For benches and tests that drive the proxy as a process without mlx: `bench/scripts/load_bench.py`,
`bench/scripts/load_bench.py hostile`, `tests/proxy/test_hostile.py`. Every process is a
`mtpstack.runtime.Process` on loopback, started into a `Processes` the caller may share (so one
registry stops everything at exit).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mtpstack.runtime import Process, Processes, free_port, url_of

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
#: Starting a fake or the proxy takes about a second; the bound covers a busy 2-core machine.
START_TIMEOUT = 60.0


@dataclass
class FakeUpstream:
    """One fake worker serving `model` at `gate` concurrent requests; `args` go to `devkit.fake_upstream`
    (pacing: `--delay`, `--chunks`, `--interval`)."""

    name: str
    model: str
    gate: int
    log: Path
    processes: Processes
    args: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    process: Process | None = None

    @property
    def url(self) -> str:
        return url_of(HOST, self.port)

    def start(self) -> Process:
        """Start (again, after a kill) without waiting; the proxy's health check sees it come up."""
        argv = [sys.executable, "-m", "devkit.fake_upstream", "--host", HOST, "--port", str(self.port), "--gate", str(self.gate),
                "--name", self.name, *self.args]
        self.process = self.processes.start(argv, log_path=self.log, name=self.name, kind="fake upstream", url=self.url, cwd=ROOT)
        return self.process

    def kill(self) -> None:
        """SIGKILL it, as a crash would, and reap it."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(5)

    def worker_config(self) -> dict:
        return {"model": self.model, "target": {"path": "fake/upstream", "bits": 4}, "maxNumSeqs": self.gate, "host": HOST, "port": self.port}


class FakeFleet:
    """Fake upstreams `(name, model, gate)` and a proxy in front of them, configured by `proxy` (the
    config's `proxy` section without host and port), all in `workdir`: `fleet.yaml`, one log each."""

    def __init__(self, workdir: Path, fakes: Sequence[tuple[str, str, int]], proxy: dict, *,
                 fake_args: Sequence[str] = (), processes: Processes | None = None):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.processes = processes if processes is not None else Processes()
        self.fakes = [FakeUpstream(name, model, gate, self.dir / f"{name}.log", self.processes, fake_args) for name, model, gate in fakes]
        self.port = free_port()
        self.url = url_of(HOST, self.port)
        self.log = self.dir / "proxy.log"
        self.config_path = self.dir / "fleet.yaml"
        self.config_path.write_text(yaml.safe_dump({
            "proxy": {"host": HOST, "port": self.port, **proxy},
            "workers": {f.name: f.worker_config() for f in self.fakes},
        }))
        self.proxy: Process | None = None

    def start(self) -> None:
        """Start the fakes, wait for their /health, then the proxy and its /readyz; `runtime.StartError` otherwise."""
        for f in self.fakes:
            f.start()
        for f in self.fakes:
            f.process.wait_ready("/health", START_TIMEOUT)
        self.proxy = self.processes.start([sys.executable, "-m", "mtpstack", "proxy", "--config", str(self.config_path)],
                                          log_path=self.log, name="proxy", kind="proxy", url=self.url, cwd=ROOT)
        self.proxy.wait_ready("/readyz", START_TIMEOUT)

    def stop(self) -> None:
        """The proxy first, then the fakes."""
        for p in [self.proxy, *(f.process for f in self.fakes)]:
            if p is not None:
                p.stop()


@contextlib.contextmanager
def proxy_before_fake(tmp: Path, client_seconds: float) -> Iterator[FakeFleet]:
    """`mtpstack proxy` (its log in `tmp/proxy.log`) in front of one fake worker `w` of model `m`
    at a gate of 2, with `proxy.timeouts.clientSeconds`; both stopped on exit."""
    fleet = FakeFleet(tmp, [("w", "m", 2)], {"concurrencyLimit": 2, "timeouts": {"clientSeconds": client_seconds}})
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()
