"""The proxy dials a worker placed on another host at that host's address, not at the worker's listen address."""

from __future__ import annotations

from mtpstack.proxy import STATE, create_app
from devkit.fake_upstream import FakeState, make_app
from mtpstack.validator import FleetConfig


async def test_a_worker_on_another_host_is_dialled_at_its_hosts_address(aiohttp_server, aiohttp_client):
    worker = await aiohttp_server(make_app(FakeState(gate=1, name="w")))
    config = FleetConfig.model_validate(
        {
            "proxy": {"deployOn": "gw", "timeouts": {"connectSeconds": 0.5}},
            "hosts": {"gw": {"address": "10.0.0.1"}, "mac1": {"address": "127.0.0.1"}},
            # 192.0.2.1 (TEST-NET-1) routes nowhere: reaching the fake proves the host's address was dialled.
            "workers": {"w": {"model": "m", "target": {"path": "/m", "bits": 4}, "maxNumSeqs": 1,
                              "host": "192.0.2.1", "port": worker.port, "deployOn": "mac1"}},
        }
    )  # fmt: skip
    app = create_app(config, health_interval=60)
    client = await aiohttp_client(app)
    state = app[STATE]
    assert state.upstreams["w"].url == f"http://127.0.0.1:{worker.port}"
    state.admissions["m"].set_healthy(state.upstreams["w"], True, "as if a check had just passed")
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status == 200, await r.text()
