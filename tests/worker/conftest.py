"""Fixtures for the worker tests: tiny random model pairs and live worker processes on loopback."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import openai
import pytest

mx = pytest.importorskip("mlx.core", reason="the worker tests need mlx")

from mtpstack.validator import WorkerProfile, worker_argv  # noqa: E402
from devkit.demo.tiny import build_tiny_pair  # noqa: E402
from mtpstack.worker.launcher import resolve_command, worker_env  # noqa: E402
from mtpstack.runtime import Process, free_port, url_of  # noqa: E402

#: Every HTTP call in these tests is bounded by this.
HTTP_TIMEOUT = 30.0
#: A tiny worker loads in well under a second; the margin is for a busy 2-core CI machine.
START_TIMEOUT = 60.0


@pytest.fixture(scope="session")
def echo_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A drafter identical to its target: every drafted token must be accepted."""
    return build_tiny_pair(tmp_path_factory.mktemp("echo"), seed=3, drafter_from_target=True)


@pytest.fixture
def client(worker):
    """The official OpenAI client on the test module's `worker` fixture."""
    return openai.OpenAI(base_url=worker.url + "/v1", api_key="unused", timeout=60, max_retries=0)


def copy_pair(pair: tuple[Path, Path], dest: Path) -> tuple[Path, Path]:
    t, d = pair
    return Path(shutil.copytree(t, dest / "target")), Path(shutil.copytree(d, dest / "drafter"))


class LiveWorker:
    """A real `mtpstack worker` subprocess, started from `validator.worker_argv` like `mtpstack up` does."""

    def __init__(self, tmp: Path, target: Path, drafter: Path | None, *, depth: int = 3, width: int = 3,
                 extra: list[str] = (), env: dict | None = None, name: str = "tiny", max_context_tokens: int | None = None,
                 prefix_cache_gib: float | None = None, prefix_cache_dir: Path | None = None,
                 prefix_cache_disk_gib: float | None = None):
        self.port = free_port()
        spec = {
            "model": name,
            "backend": "native",
            "target": {"path": str(target), "bits": "fp32"},
            "drafter": {"path": str(drafter), "bits": "fp32", "depth": depth} if drafter else None,
            "maxNumSeqs": width,
            "host": "127.0.0.1",
            "port": self.port,
            "extraArgs": list(extra),
            "maxContextTokens": max_context_tokens,
        }
        cache = {"maxGiB": prefix_cache_gib, "dir": str(prefix_cache_dir) if prefix_cache_dir else None,
                 "diskGiB": prefix_cache_disk_gib}
        if any(v is not None for v in cache.values()):
            spec["prefixCache"] = {k: v for k, v in cache.items() if v is not None}
        self.profile = WorkerProfile.model_validate(spec)
        self.argv = resolve_command(worker_argv(self.profile))
        self.proc = Process(self.argv, log_path=tmp / f"worker-{self.port}.log", name=name, kind="worker",
                            url=url_of("127.0.0.1", self.port), env=worker_env({**__import__("os").environ, **(env or {})}))
        self.url = self.proc.url
        self.name = name

    def __enter__(self) -> "LiveWorker":
        self.proc.start()
        try:
            self.proc.wait_ready("/health", START_TIMEOUT, state="healthy")
        except Exception:
            self.proc.stop(timeout=5)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stop(timeout=5)

    def get_json(self, path: str) -> dict:
        return json.loads(self.get_text(path))

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=HTTP_TIMEOUT) as resp:
            return resp.read().decode()

    def post_json(self, path: str, body) -> tuple[int, dict, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
                return resp.status, dict(resp.headers), json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), json.loads(e.read())


@pytest.fixture
def pair_copier():
    """`copy_pair(pair, dest)`: a private copy of a model pair, for tests that change files."""
    return copy_pair


@pytest.fixture(scope="session")
def live_worker_class():
    return LiveWorker


@pytest.fixture
def live_worker(tmp_path):
    """A factory: `with live_worker(target, drafter, ...) as w:`; every process is stopped on exit."""
    started: list[LiveWorker] = []

    def make(target, drafter, **kw) -> LiveWorker:
        w = LiveWorker(tmp_path, target, drafter, **kw)
        started.append(w)
        return w

    yield make
    for w in started:
        w.proc.stop(timeout=5)



def family_pair(family: str, what: str):
    """The session fixture `<family>_pair`: `<family>_pair(layout)` -> (target dir, head dir), `what`
    `devkit.demo.tiny_families.build_tiny_<family>_pair` builds, built once per layout."""

    def fixture(tmp_path_factory):
        from devkit.demo import tiny_families

        build = getattr(tiny_families, f"build_tiny_{family}_pair")
        built: dict[str, tuple[Path, Path]] = {}

        def get(layout: str) -> tuple[Path, Path]:
            if layout not in built:
                built[layout] = build(tmp_path_factory.mktemp(f"{family}-{layout}"), layout)
            return built[layout]

        return get

    fixture.__doc__ = f"`{family}_pair(layout)`: {what}."
    return pytest.fixture(fixture, scope="session", name=f"{family}_pair")


moe_pair = family_pair("moe", "the tiny Qwen3.5 MoE target and its head in one of `MOE_LAYOUTS`")
next_pair = family_pair("next", "the tiny Qwen3-Next target and its `qwen3_5_mtp` head, standalone or bundled")
nemotron_pair = family_pair("nemotron", "the tiny Nemotron-H target and its `nemotron_h_mtp` head, standalone or bundled")
glm_pair = family_pair("glm", "the tiny GLM-4.7-Flash target and its `glm4_moe_lite_mtp` head, standalone or bundled")
