"""Background health checks: each worker's `GET /health`, on a fixed interval.

The native worker answers 503 while loading or when its generation loop has work but makes no
progress, and mlx_lm.server answers 503 once its generation thread died, so a 200 means
"serving", not merely "socket open". Unhealthy workers get no new requests until a check passes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator

from aiohttp import web

from mtpstack.proxy.admission import Upstream
from mtpstack.proxy.state import STATE, ProxyState
from mtpstack.proxy.upstream import UpstreamClient, UpstreamError

log = logging.getLogger("mtpstack.proxy")

#: A dead worker stops getting traffic within about a second (sooner when a request finds it
#: dead), and one small GET per second per worker costs nothing next to a generation.
HEALTH_INTERVAL_SECONDS = 1.0
#: A worker busy generating still answers /health from its HTTP thread within milliseconds;
#: seconds of silence mean it is wedged.
HEALTH_TIMEOUT_SECONDS = 3.0


async def probe(client: UpstreamClient, timeout: float) -> tuple[bool, str]:
    """(healthy, detail) from one `GET /health`."""
    resp = None
    try:
        async with asyncio.timeout(timeout):
            resp = await client.request("GET", "/health", [])
            await resp.read_all()
    except TimeoutError:
        return False, f"/health did not answer within {timeout:g} s"
    except UpstreamError as e:
        return False, f"unreachable: {e}"
    finally:
        if resp is not None:
            resp.close()
    if resp.status == 200:
        return True, "ok"
    return False, f"/health answered {resp.status}"


def set_health(state: ProxyState, upstream: Upstream, healthy: bool, detail: str) -> None:
    changed = state.admissions[upstream.model].set_healthy(upstream, healthy, detail)
    state.metrics.set_healthy(upstream.name, healthy)
    if changed and not healthy and upstream.cache_id is None:
        forget_worker(state, upstream)  # with a lasting cache, its next identity decides (`fleet`)
    if changed:
        log.info(json.dumps({"event": "worker_health", "worker": upstream.name, "healthy": healthy, "detail": detail}))


def forget_worker(state: ProxyState, upstream: Upstream) -> None:
    """The worker's prefix cache is gone or unknown (it went unhealthy, or restarted, without a cache
    that outlives it): no request is routed to it for what it served before."""
    affinity = state.affinities.get(upstream.model)
    if affinity is not None:
        affinity.forget(upstream.name)


def mark_unhealthy(state: ProxyState, upstream: Upstream, detail: str) -> None:
    """A request found the worker dead: stop sending it traffic until a check passes."""
    set_health(state, upstream, False, detail)


async def _watch(state: ProxyState, upstream: Upstream) -> None:
    client = state.clients[upstream.name]
    while True:
        await asyncio.sleep(state.health_interval)
        healthy, detail = await probe(client, min(HEALTH_TIMEOUT_SECONDS, max(state.health_interval, 0.5) * 3))
        set_health(state, upstream, healthy, detail)


async def health_ctx(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: check every worker once before serving, then keep checking."""
    state = app[STATE]
    ups = list(state.upstreams.values())
    results = await asyncio.gather(*(probe(state.clients[u.name], HEALTH_TIMEOUT_SECONDS) for u in ups))
    for u, (healthy, detail) in zip(ups, results):
        set_health(state, u, healthy, detail)
    tasks = [asyncio.create_task(_watch(state, u), name=f"health:{u.name}") for u in ups]
    yield
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
