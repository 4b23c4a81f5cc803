"""`mtpstack proxy` as a process: refusing bad configs, graceful shutdown, and a worker
process killed mid-stream."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from mtpstack.proxy import create_app
from mtpstack.runtime import Process, free_port, url_of
from mtpstack.validator import FleetConfig

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpstack", *args], capture_output=True, text=True, cwd=ROOT, timeout=30, **kw)


async def wait_ready(proc: Process, path: str, timeout: float = 15.0) -> None:
    await asyncio.to_thread(proc.wait_ready, path, timeout)


def start_fake(tmp: Path, port: int, *extra: str) -> Process:
    return Process(
        [sys.executable, "-m", "devkit.fake_upstream", "--port", str(port), *extra],
        log_path=tmp / "fake.log", name="fake", kind="fake upstream", url=url_of("127.0.0.1", port), cwd=ROOT,
    ).start()


def test_invalid_config_refuses_to_start_with_the_validators_report():
    r = run_cli("proxy", "--config", "examples/invalid/concurrency-mismatch.yaml")
    assert r.returncode == 1
    assert "error[concurrency-mismatch]" in r.stderr
    assert "not starting the proxy" in r.stderr
    assert r.stdout == ""
    assert "Traceback" not in r.stderr


def test_missing_config_file_refuses_to_start():
    r = run_cli("proxy", "--config", "does/not/exist.yaml")
    assert r.returncode == 1 and "error[unreadable]" in r.stderr and "Traceback" not in r.stderr


def test_unreadable_api_keys_file_refuses_to_start(tmp_path):
    cfg = tmp_path / "fleet.json"
    cfg.write_text(json.dumps({
        "proxy": {"port": free_port(), "apiKeysFile": str(tmp_path / "missing-keys")},
        "workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": free_port()}},
    }))
    r = run_cli("proxy", "--config", str(cfg))
    assert r.returncode == 1
    assert "cannot read the API keys file" in r.stderr and "hint: check `proxy.apiKeysFile`" in r.stderr


async def test_sigterm_lets_in_flight_requests_finish_then_exits(tmp_path):
    up_port, proxy_port = free_port(), free_port()
    fake = start_fake(tmp_path, up_port, "--gate", "1")
    cfg = tmp_path / "fleet.json"
    cfg.write_text(json.dumps({
        "proxy": {"port": proxy_port, "shutdownGraceSeconds": 10},
        "workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": up_port}},
    }))
    proc = Process(
        [sys.executable, "-m", "mtpstack", "proxy", "--config", str(cfg)], log_path=tmp_path / "proxy.log",
        stdout_path=tmp_path / "proxy.out", name="proxy", kind="proxy", url=url_of("127.0.0.1", proxy_port), cwd=ROOT,
    ).start()
    try:
        await wait_ready(fake, "/health")
        await wait_ready(proc, "/readyz")
        async with aiohttp.ClientSession() as s:
            body = {"model": "m", "stream": True, "x_fake": {"chunks": 5, "interval": 0.2}}
            async with s.post(f"http://127.0.0.1:{proxy_port}/v1/chat/completions", json=body) as r:
                await r.content.readuntil(b"\n\n")  # admitted and streaming
                proc.signal(signal.SIGTERM)
                rest = await r.read()
            assert r.status == 200 and rest.endswith(b"data: [DONE]\n\n")
            with pytest.raises(aiohttp.ClientConnectionError):
                async with s.get(f"http://127.0.0.1:{proxy_port}/healthz"):
                    pass
        code = await asyncio.to_thread(proc.wait, 10)
        assert code == 0
        log = [json.loads(line) for line in (tmp_path / "proxy.log").read_text().splitlines() if line.startswith("{")]
        events = [e["event"] for e in log]
        assert events.index("listening") < events.index("draining") < events.index("stopped") == len(events) - 1
        assert any(e["event"] == "request" and e["status"] == 200 for e in log)
        assert (tmp_path / "proxy.out").read_text() == ""
    finally:
        proc.stop()
        fake.stop()


async def test_worker_process_killed_mid_stream(aiohttp_client, tmp_path):
    port = free_port()
    fake = start_fake(tmp_path, port, "--gate", "1", "--chunks", "1000", "--interval", "0.01")
    try:
        await wait_ready(fake, "/health")
        config = FleetConfig.model_validate(
            {"workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": port}}}
        )
        client = await aiohttp_client(create_app(config, health_interval=60))
        r = await client.post("/v1/chat/completions", json={"model": "m", "stream": True})
        assert r.status == 200
        for _ in range(3):
            await r.content.readuntil(b"\n\n")
        fake.kill()
        rest = await r.read()
        last = [e for e in rest.split(b"\n\n") if e][-1]
        assert json.loads(last.removeprefix(b"data: "))["error"]["code"] == "upstream_disconnected"
        r2 = await client.post("/v1/chat/completions", json={"model": "m"})
        assert r2.status == 503  # marked unhealthy, no traffic
    finally:
        fake.stop()


#: `python -c` running `mtpstack` as a machine without uvloop would: its import fails.
WITHOUT_UVLOOP = "import sys; sys.modules['uvloop'] = None; from mtpstack.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize(
    ("argv", "loop", "fallback"),
    [
        (["-m", "mtpstack"], "uvloop", False),
        (["-m", "mtpstack"], "asyncio", False),
        (["-c", WITHOUT_UVLOOP], "auto", True),
    ],
    ids=["uvloop-by-default", "asyncio-when-asked", "asyncio-without-uvloop"],
)
async def test_the_listening_line_names_the_event_loop_that_serves(tmp_path, argv, loop, fallback):
    up_port, proxy_port = free_port(), free_port()
    fake = start_fake(tmp_path, up_port, "--gate", "1")
    cfg = tmp_path / "fleet.json"
    cfg.write_text(json.dumps({
        "proxy": {"port": proxy_port},
        "workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": up_port}},
    }))
    extra = [] if loop == "uvloop" else ["--loop", loop]
    proc = Process(
        [sys.executable, *argv, "proxy", "--config", str(cfg), *extra], log_path=tmp_path / "proxy.log",
        name="proxy", kind="proxy", url=url_of("127.0.0.1", proxy_port), cwd=ROOT,
    ).start()
    try:
        await wait_ready(fake, "/health")
        await wait_ready(proc, "/readyz")
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{proxy_port}/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
    finally:
        proc.stop()
        fake.stop()
    log = [json.loads(line) for line in (tmp_path / "proxy.log").read_text().splitlines() if line.startswith("{")]
    listening = next(e for e in log if e["event"] == "listening")
    assert listening["event_loop"] == ("asyncio" if fallback else loop)
    if fallback:
        assert "uvloop cannot be imported" in listening["event_loop_fallback"] and "pip install uvloop" in listening["event_loop_fallback"]
    else:
        assert "event_loop_fallback" not in listening


def test_asking_for_uvloop_where_it_is_missing_refuses_to_start_naming_the_fix(tmp_path):
    cfg = tmp_path / "fleet.json"
    cfg.write_text(json.dumps({
        "proxy": {"port": free_port()},
        "workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": free_port()}},
    }))
    r = subprocess.run([sys.executable, "-c", WITHOUT_UVLOOP, "proxy", "--config", str(cfg), "--loop", "uvloop"],
                       capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "error: `--loop uvloop` was asked for, but uvloop cannot be imported" in r.stderr
    assert "hint: install it (`pip install uvloop`), or pass `--loop asyncio`" in r.stderr
