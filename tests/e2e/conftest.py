"""A real stack for end-to-end tests: `mtpstack up` as a subprocess, tiny real models, loopback only."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from mtpstack.proxy.prometheus import parse_samples, sample
from mtpstack.runtime import Process, free_port, http_status, url_of
from mtpstack.validator import FleetConfig, worker_argv
from mtpstack.worker.launcher import resolve_command, worker_env

#: Loading tiny models takes well under a second; the bound covers a busy 2-core CI machine.
STARTUP_TIMEOUT = 120.0


def get_json(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    return http_status(url, timeout)


def get_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def metric(text: str, name: str, **labels) -> float | None:
    """The value of one sample in Prometheus text; None when absent."""
    return sample(parse_samples(text), name, **labels)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def answered_requests(proxy_url: str, model: str, seconds: float = 10.0) -> tuple[float | None, str]:
    """The proxy's count of 200 answers for `model`, looked at again for a few seconds: an agent CLI
    exits on its stream's last event, which can be before the proxy has finished the exchange and counted it.
    With the count, the proxy's request counts by status (for the failure message)."""
    deadline = time.monotonic() + seconds
    while True:
        text = get_text(f"{proxy_url}/metrics")
        answered = metric(text, "mtpstack_proxy_requests_total", model=model, status="200")
        if answered or time.monotonic() > deadline:
            return answered, "\n".join(line for line in text.splitlines() if line.startswith("mtpstack_proxy_requests_total"))
        time.sleep(0.2)


def demo_config(**worker) -> dict:
    """The demo fleet as `mtpstack up` ships it, on free ports, its worker's profile updated with `worker`."""
    from mtpstack.up import default_fleet

    config = default_fleet()
    config["proxy"]["port"] = free_port()
    config["workers"]["demo"].update(port=free_port(), **worker)
    return config


class Stack:
    """A running `mtpstack up` and the addresses of what it started."""

    def __init__(self, root: Path, config: dict, up_args: list[str] = ()):
        self.root = root
        self.config_path = root / "fleet.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.run_dir = root / "run"
        self.config = config
        self.proxy_url = url_of("127.0.0.1", config["proxy"]["port"])
        self.err_path = root / "up.err"
        self.proc = Process(
            [sys.executable, "-m", "mtpstack", "up", str(self.config_path), "--run-dir", str(self.run_dir), "--health-timeout", "90", *up_args],
            log_path=self.err_path, stdout_path=root / "up.out", name="mtpstack up", kind="stack", url=self.proxy_url, cwd=root,
        ).start()

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        self.proc.wait_ready("/readyz", timeout)

    def state(self) -> dict:
        return json.loads((self.run_dir / "state.json").read_text())

    def worker_pid(self, name: str) -> int:
        return self.state()["workers"][name]["pid"]

    def worker_url(self, name: str) -> str:
        return self.state()["workers"][name]["url"]

    def pids(self) -> list[int]:
        state = self.state()
        return [p for p in [state["proxy"].get("pid"), *(w.get("pid") for w in state["workers"].values())] if p]

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM `mtpstack up`, as a service manager stops it; its exit code."""
        return self.proc.stop(timeout)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not a live process
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def fleet(target: Path, drafter: Path, *, width: int, workers: int = 1, extra_args: list[str] | None = None) -> dict:
    return {
        "proxy": {"port": free_port(), "modelConcurrencyLimits": {"tiny": width}, "queue": {"maxWaiting": 64, "timeoutSeconds": 60}},
        "workers": {
            f"w{i}": {
                "model": "tiny",
                "target": {"path": str(target), "bits": "fp32"},
                "drafter": {"path": str(drafter), "bits": "fp32", "depth": 3},
                "maxNumSeqs": width,
                "port": free_port(),
                "extraArgs": extra_args or [],
            }
            for i in range(workers)
        },
    }


@contextlib.contextmanager
def running_stack(root: Path, config: dict):
    """`mtpstack up` on `config`, ready; stopped afterwards, with every process it started gone."""
    s = Stack(root, config)
    try:
        s.wait_ready()
        yield s
    finally:
        pids = s.pids() if (s.run_dir / "state.json").exists() else []
        s.stop()
        for pid in pids:
            wait_until(lambda: not alive(pid), 15, f"process {pid} to exit")


class Workers:
    """Real workers of a fleet (`fleet(...)`), each its own process, restartable; the proxy is the test's."""

    def __init__(self, data: dict, logdir: Path):
        self.data = data
        self.logdir = logdir
        self.procs: dict[str, Process] = {}

    def start(self, name: str) -> None:
        profile = FleetConfig.model_validate(self.data).workers[name]
        proc = Process(resolve_command(worker_argv(profile)), log_path=self.logdir / f"{name}.log", name=name, kind="worker",
                       url=url_of(profile.host, profile.port), env=worker_env()).start()
        self.procs[name] = proc

    def wait_healthy(self) -> None:
        for proc in self.procs.values():
            proc.wait_ready("/health", 120, state="healthy")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()


@contextlib.contextmanager
def running_workers(data: dict, logdir: Path):
    """Every worker of `data` started and healthy; stopped afterwards."""
    w = Workers(data, logdir)
    try:
        for name in data["workers"]:
            w.start(name)
        w.wait_healthy()
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def stack(tiny_pair, tmp_path_factory):
    """One worker of width 2 behind the proxy with gate 2, as `mtpstack up` starts them."""
    with running_stack(tmp_path_factory.mktemp("stack"), fleet(*tiny_pair, width=2)) as s:
        yield s


@pytest.fixture
def width_1_worker(tiny_pair, tmp_path):
    """A real worker serving one sequence at a time, with a short admission grace."""
    data = fleet(*tiny_pair, width=1, extra_args=["--admission-grace-seconds", "0.2"])
    profile = FleetConfig.model_validate(data).workers["w0"]
    proc = Process(
        resolve_command(worker_argv(profile)), log_path=tmp_path / "worker.log", kind="worker", url=url_of(profile.host, profile.port),
        env=worker_env(),
    ).start()
    try:
        proc.wait_ready("/health", 120, state="healthy")
        yield data
    finally:
        proc.stop()
