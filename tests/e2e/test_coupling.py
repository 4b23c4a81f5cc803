"""The failure the validator exists to prevent, shown for real: a proxy gate wider than the
worker's batch width turns the excess into the worker's own 429s; a matched pair does not."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from mtpstack.proxy.app import create_app
from tests.e2e.conftest import fleet
from mtpstack.validator import FleetConfig, validate_data


async def eight_clients(data: dict, gate: int) -> list[tuple[int, str | None]]:
    data = {**data, "proxy": {**data["proxy"], "modelConcurrencyLimits": {"tiny": gate}}}
    config = FleetConfig.model_validate(data)  # no validator: a wrong pairing is built on purpose
    server = TestServer(create_app(config, health_interval=0.2))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):  # until the proxy's first health check has passed
                async with http.get(server.make_url("/readyz")) as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.1)

            async def one(i):
                body = {"model": "tiny", "prompt": f"def f{i}(", "max_tokens": 64, "temperature": 0}
                async with http.post(server.make_url("/v1/completions"), json=body) as r:
                    payload = await r.json()
                    return r.status, (payload.get("error") or {}).get("code")

            return await asyncio.gather(*(one(i) for i in range(8)))
    finally:
        await server.close()


async def test_a_gate_wider_than_the_batch_width_lets_the_worker_refuse_requests(width_1_worker):
    _, report = validate_data({**width_1_worker, "proxy": {**width_1_worker["proxy"], "modelConcurrencyLimits": {"tiny": 4}}})
    assert [f.code for f in report.errors] == ["concurrency-mismatch"]  # what the validator would have said
    results = await eight_clients(width_1_worker, gate=4)
    refused = [r for r in results if r[0] == 429]
    assert refused, results
    assert {code for _, code in refused} == {"worker_full"}


async def test_the_matched_gate_queues_at_the_proxy_and_every_request_succeeds(width_1_worker):
    results = await eight_clients(width_1_worker, gate=1)
    assert results == [(200, None)] * 8
