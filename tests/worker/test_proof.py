"""Launching and proving: the argv round trip, the environment, and `mtpstack weights` failing loudly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtpstack.validator import WorkerProfile, worker_argv
from mtpstack.worker.launcher import resolve_command, worker_env
from mtpstack.validator.claim import weights_from_argv
from mtpstack.worker.proof import read_cmdline


def _profile(backend="native", drafter=True, width=2) -> WorkerProfile:
    return WorkerProfile.model_validate({
        "model": "m", "backend": backend,
        "target": {"path": "/models/t", "bits": 4},
        "drafter": {"path": "/models/d", "bits": 6, "depth": 4} if drafter else None,
        "maxNumSeqs": width, "port": 8123,
    })


@pytest.mark.parametrize("backend", ["native", "mlx-lm"])
def test_the_argv_from_a_profile_names_its_weights(backend):
    argv = resolve_command(worker_argv(_profile(backend)))
    claim = weights_from_argv(argv)
    assert (claim.backend, claim.target, claim.drafter, claim.depth) == (backend, "/models/t", "/models/d", 4)
    assert claim.port == 8123
    # mlx_lm.server serves one request at a time once a draft model is set, whatever its flags say.
    assert claim.max_num_seqs == (2 if backend == "native" else 1)


@pytest.mark.parametrize("head", [
    ["/usr/bin/python3", "/venv/bin/mtpstack"],
    ["/usr/bin/python3", "-m", "mtpstack"],
    ["/nix/store/x-python3/bin/python3.11", "/nix/store/y-mtpstack/bin/.mtpstack-wrapped"],
])
def test_a_full_process_command_line_is_understood(head):
    argv = worker_argv(_profile())
    claim = weights_from_argv(head + argv[1:])
    assert (claim.backend, claim.target, claim.depth, claim.max_num_seqs) == ("native", "/models/t", 4, 2)


def test_without_a_drafter_there_is_no_depth():
    claim = weights_from_argv(worker_argv(_profile(drafter=False)))
    assert claim.drafter is None and claim.depth is None


def test_an_argv_that_is_no_worker_is_refused():
    with pytest.raises(ValueError):
        weights_from_argv(["python", "-m", "http.server"])


def test_resolve_command_runs_the_programs_from_this_environment():
    for program in ("mtpstack", "mlx_lm.server"):
        argv = resolve_command([program, "--x", "1"])
        assert argv[-2:] == ["--x", "1"]
        assert argv[0] == str(Path(sys.executable).parent / program) or argv[:3] == [sys.executable, "-m", program]


def test_worker_env_preloads_openblas_once_and_keeps_the_hub_offline():
    from mtpstack.worker.launcher import openblas_path

    env = worker_env({"PATH": "/bin"})
    assert env["HF_HUB_OFFLINE"] == "1"
    blas = openblas_path()
    if blas is None:
        assert "LD_PRELOAD" not in env
    else:
        assert env["LD_PRELOAD"] == str(blas)
        assert worker_env(env)["LD_PRELOAD"] == str(blas)
    assert worker_env({"HF_HUB_OFFLINE": "0"})["HF_HUB_OFFLINE"] == "0"


def test_read_cmdline_reads_a_process_own_argv():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "marker"])
    try:
        for _ in range(100):  # right after fork the child has not exec'd yet
            argv = read_cmdline(proc.pid)
            if argv and argv[-1] == "marker":
                break
            time.sleep(0.05)
        assert argv[-1] == "marker"
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(ProcessLookupError):
        read_cmdline(proc.pid)


def _weights(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpstack", "weights", *args], capture_output=True, text=True, timeout=60)


def test_weights_fails_loudly_when_the_files_changed_since_load(tiny_pair, tmp_path, pair_copier, live_worker):
    target, drafter = pair_copier(tiny_pair, tmp_path)
    with live_worker(target, drafter, width=1) as w:
        before = w.get_json("/identity")["target"]["sha256"]
        assert _weights(str(w.proc.pid)).returncode == 0
        with (target / "config.json").open("a") as f:
            f.write("\n")
        out = _weights(w.url)
        assert out.returncode == 1
        assert "changed since the worker loaded them" in out.stderr
        assert out.stderr.startswith("error: ")
    # A worker started on the changed files reports a different hash.
    with live_worker(target, drafter, width=1) as w2:
        assert w2.get_json("/identity")["target"]["sha256"] != before


def test_weights_explains_what_it_cannot_reach():
    out = _weights("127.0.0.1:9")
    assert out.returncode == 1 and "does not answer" in out.stderr
    out = _weights(str(os.getpid()))
    assert out.returncode == 1 and "is not a worker" in out.stderr


def test_weights_proves_an_mlx_lm_server_from_its_command_line_alone(tiny_pair, tmp_path):
    from mtpstack.worker.launcher import which
    from mtpstack.runtime import Process, free_port

    if which("mlx_lm.server") is None:
        pytest.skip("mlx_lm.server is not installed")
    profile = WorkerProfile.model_validate({
        "model": "m", "backend": "mlx-lm",
        "target": {"path": str(tiny_pair[0]), "bits": "fp32"},
        "drafter": {"path": str(tiny_pair[1]), "bits": "fp32", "depth": 2},
        "maxNumSeqs": 1, "port": free_port(),
    })
    proc = Process(resolve_command(worker_argv(profile)), log_path=tmp_path / "mlx.log", kind="worker", env=worker_env()).start()
    try:
        out = _weights(str(proc.pid))
        assert out.returncode == 0, out.stderr
        assert "mlx-lm" in out.stdout and "command line alone" in out.stdout
        assert str(tiny_pair[1]) in out.stdout
    finally:
        proc.stop(timeout=5)


def test_health_says_loading_until_the_models_are_in(tiny_pair, live_worker):
    import json
    import urllib.error
    import urllib.request

    from mtpstack.worker.generation import LOAD_DELAY_ENV

    w = live_worker(*tiny_pair, width=1, env={LOAD_DELAY_ENV: "5"})
    w.proc.start()
    seen = None
    for _ in range(200):  # the server listens at once; loading waits 5 s
        try:
            urllib.request.urlopen(w.url + "/health", timeout=5)
        except urllib.error.HTTPError as e:
            seen = (e.code, json.loads(e.read())["status"])
            break
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
            continue
        break
    assert seen == (503, "loading")
    status, _, body = w.post_json("/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert (status, body["error"]["code"]) == (503, "loading")
    w.proc.wait_ready("/health", 60, state="healthy")
    assert w.post_json("/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
