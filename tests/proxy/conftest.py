"""Fixtures: real aiohttp upstreams on loopback (`devkit.fake_upstream`, counting their own
concurrency) and a proxy built from a `FleetConfig` pointing at them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from mtpstack.proxy import create_app
from devkit.fake_upstream import FakeState, make_app
from mtpstack.validator import FleetConfig

#: Test modules run on both event loops `mtpstack proxy` runs on (`mtpstack.proxy.eventloop`): the
#: upstream client's framings and the proxy's relaying, where the loops' transports differ.
BOTH_LOOPS = frozenset({"test_upstream.py", "test_proxy.py"})

#: Health checks every 50 ms: tests see a worker's death or recovery within a few loop turns.
TEST_HEALTH_INTERVAL = 0.05


@dataclass
class Fleet:
    client: TestClient
    fakes: dict[str, FakeState]
    servers: dict[str, TestServer]
    config: FleetConfig
    app: Any = None
    extra: dict = field(default_factory=dict)

    @property
    def state(self):
        from mtpstack.proxy import STATE

        return self.client.server.app[STATE]

    @property
    def collector(self):
        from mtpstack.proxy.fleet import FLEET

        return self.client.server.app[FLEET]

    def assert_no_violations(self) -> None:
        for name, f in self.fakes.items():
            assert f.violations == 0, f"worker {name} was sent more than its gate of {f.gate}: {f.stats()}"
            assert f.max_active <= f.gate, f.stats()


def fleet_config(ports: dict[str, int], workers: dict[str, dict], proxy: dict | None = None) -> FleetConfig:
    """A config built with `model_validate` (no coupling rules), so a test may give a worker a
    gate that differs from its batch width on purpose."""
    proxy = dict(proxy or {})
    limits = dict(proxy.pop("modelConcurrencyLimits", {}))
    data_workers = {}
    for name, w in workers.items():
        model = w.get("model", "m")
        limits.setdefault(model, w.get("proxy_gate", w.get("gate", 1)))
        data_workers[name] = {
            "model": model,
            "backend": w.get("backend", "native"),
            "target": {"path": w.get("target", f"/models/{model}"), "bits": 4},
            "maxNumSeqs": w.get("gate", 1),
            "host": "127.0.0.1",
            "port": ports[name],
        }
    data = {
        "proxy": {"port": 1, "modelConcurrencyLimits": limits, **proxy},
        "policy": {"allowedBackends": ["native", "mlx-lm"]},
        "workers": data_workers,
    }
    return FleetConfig.model_validate(data)


@pytest.fixture
async def make_fleet(aiohttp_server, aiohttp_client):
    """`await make_fleet({"w1": {"gate": 2, "model": "m"}}, proxy={...})` -> Fleet.
    `gate` is the fake worker's batch width; `proxy_gate` (default: the same) the proxy's."""

    async def make(
        workers: dict[str, dict], proxy: dict | None = None, health_interval: float = TEST_HEALTH_INTERVAL,
        fleet_interval: float = TEST_HEALTH_INTERVAL, **fake_kw,
    ) -> Fleet:
        fakes, servers = {}, {}
        for name, w in workers.items():
            fakes[name] = FakeState(gate=w.get("gate", 1), name=name, identity=w.get("identity"), metrics=w.get("metrics"), **fake_kw)
            servers[name] = await aiohttp_server(make_app(fakes[name]))
        config = fleet_config({n: s.port for n, s in servers.items()}, workers, proxy)
        client = await aiohttp_client(create_app(config, health_interval=health_interval, fleet_interval=fleet_interval))
        return Fleet(client=client, fakes=fakes, servers=servers, config=config)

    return make



def pytest_asyncio_loop_factories(config, item):
    """Each test of a `BOTH_LOOPS` module once on asyncio's loop and once on uvloop's; the others on asyncio's."""
    if item.path.name not in BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop}
    import uvloop

    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
