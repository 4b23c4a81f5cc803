"""`mtpstack up` on a fleet whose worker spans two hosts that are both this machine (loopback
addresses): every rank runs here, with the environment `mlx.launch` would set; the proxy serves
through rank 0; a killed rank brings the worker down as one and `up` brings it back as one."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pytest

from mtpstack.runtime import free_port, free_port_run

from tests.e2e.conftest import Stack, alive, wait_until

pytest.importorskip("mlx.core", reason="the distributed worker needs mlx")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from devkit.demo.tiny_hybrid import build_tiny_hybrid_pair

    return build_tiny_hybrid_pair(tmp_path_factory.mktemp("hybrid"), seed=0)


def spanning_fleet(target, head) -> dict:
    return {
        "hosts": {"h0": {"address": "127.0.0.1"}, "h1": {"address": "127.0.0.1"}},
        "proxy": {"port": free_port(), "deployOn": "h0", "modelConcurrencyLimits": {"tiny": 2}},
        "workers": {"big": {
            "model": "tiny",
            "target": {"path": str(target), "bits": "fp32"},
            "drafter": {"path": str(head), "bits": "fp32", "depth": 3, "kind": "mtp"},
            "maxNumSeqs": 2,
            "port": free_port(),
            "prefixCache": {"maxGiB": 0},
            "distributed": {"hosts": ["h0", "h1"], "strategy": "pipeline", "basePort": free_port_run(2)},
        }},
    }


def complete(url: str) -> dict:
    body = {"model": "tiny", "prompt": "def main():", "max_tokens": 8, "temperature": 0}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def test_up_runs_every_rank_on_a_loopback_fleet_and_restarts_the_worker_as_one(hybrid, tmp_path):
    config = spanning_fleet(*hybrid)
    stack = Stack(tmp_path, config)
    pids: list[int] = []
    try:
        stack.wait_ready()
        state = stack.state()["workers"]["big"]
        [rank1] = state["ranks"]
        assert (state["rank"], rank1["rank"]) == (0, 1)
        pids = [state["pid"], rank1["pid"]]
        env = open(f"/proc/{rank1['pid']}/environ", "rb").read().split(b"\0")
        assert b"MLX_RANK=1" in env and any(e.startswith(b"MLX_HOSTFILE=") for e in env)
        first = complete(stack.proxy_url)["choices"][0]["text"]

        os.kill(rank1["pid"], signal.SIGKILL)
        # Rank 0 notices, exits; `up` restarts both ranks.
        wait_until(lambda: not alive(pids[0]), 30, "rank 0 to exit after losing rank 1")

        def back():
            s = stack.state()["workers"]["big"]
            return s["pid"] not in pids and s.get("ranks") and s["ranks"][0]["pid"] not in pids and s["ranks"][0]["pid"]

        wait_until(back, 60, "`up` to restart both ranks")
        wait_until(lambda: _ok(stack.proxy_url), 90, "the restarted worker to answer through the proxy")
        assert complete(stack.proxy_url)["choices"][0]["text"] == first
        state = stack.state()["workers"]["big"]
        pids += [state["pid"], state["ranks"][0]["pid"]]
    finally:
        stack.stop()
    for pid in pids:
        wait_until(lambda: not alive(pid), 15, f"process {pid} to be gone")


def _ok(url: str) -> bool:
    try:
        complete(url)
        return True
    except OSError:
        return False
