"""`mtpstack proxy` as a process: refusing bad configs, graceful shutdown, and a worker
process killed mid-stream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from mtpstack.proxy import create_app
from mtpstack.validator import FleetConfig
from mtpstack.worker.proof import free_port

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpstack", *args], capture_output=True, text=True, cwd=ROOT, timeout=30, **kw)


async def wait_http(url: str, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"process exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} not ready within {timeout} s")


def start_fake(port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "devkit.fake_upstream", "--port", str(port), *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


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
    fake = start_fake(up_port, "--gate", "1")
    cfg = tmp_path / "fleet.json"
    cfg.write_text(json.dumps({
        "proxy": {"port": proxy_port, "shutdownGraceSeconds": 10},
        "workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": up_port}},
    }))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mtpstack", "proxy", "--config", str(cfg)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        await wait_http(f"http://127.0.0.1:{up_port}/health", proc=fake)
        await wait_http(f"http://127.0.0.1:{proxy_port}/readyz", proc=proc)
        async with aiohttp.ClientSession() as s:
            body = {"model": "m", "stream": True, "x_fake": {"chunks": 5, "interval": 0.2}}
            async with s.post(f"http://127.0.0.1:{proxy_port}/v1/chat/completions", json=body) as r:
                await r.content.readuntil(b"\n\n")  # admitted and streaming
                proc.send_signal(signal.SIGTERM)
                rest = await r.read()
            assert r.status == 200 and rest.endswith(b"data: [DONE]\n\n")
            with pytest.raises(aiohttp.ClientConnectionError):
                async with s.get(f"http://127.0.0.1:{proxy_port}/healthz"):
                    pass
        code = await asyncio.to_thread(proc.wait, 10)
        assert code == 0
        log = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
        events = [e["event"] for e in log]
        assert events.index("listening") < events.index("draining") < events.index("stopped") == len(events) - 1
        assert any(e["event"] == "request" and e["status"] == 200 for e in log)
        assert proc.stdout.read() == ""
    finally:
        stop(proc)
        stop(fake)


async def test_worker_process_killed_mid_stream(aiohttp_client):
    port = free_port()
    fake = start_fake(port, "--gate", "1", "--chunks", "1000", "--interval", "0.01")
    try:
        await wait_http(f"http://127.0.0.1:{port}/health", proc=fake)
        config = FleetConfig.model_validate(
            {"workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1, "port": port}}}
        )
        client = await aiohttp_client(create_app(config, health_interval=60))
        r = await client.post("/v1/chat/completions", json={"model": "m", "stream": True})
        assert r.status == 200
        for _ in range(3):
            await r.content.readuntil(b"\n\n")
        os.kill(fake.pid, signal.SIGKILL)
        rest = await r.read()
        last = [e for e in rest.split(b"\n\n") if e][-1]
        assert json.loads(last.removeprefix(b"data: "))["error"]["code"] == "upstream_disconnected"
        r2 = await client.post("/v1/chat/completions", json={"model": "m"})
        assert r2.status == 503  # marked unhealthy, no traffic
    finally:
        stop(fake)
