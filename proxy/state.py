"""The proxy's state: what its handlers, health checks and fleet collector share, on the app as `STATE`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiohttp import web

from mtpstack.proxy.admission import ModelAdmission, Upstream
from mtpstack.proxy.deadline import ClientDeadlines
from mtpstack.proxy.metrics import ProxyMetrics
from mtpstack.proxy.routing import Affinity
from mtpstack.proxy.tenants import Tenants
from mtpstack.proxy.upstream import UpstreamClient
from mtpstack.validator import FleetConfig


@dataclass(eq=False)
class ProxyState:
    config: FleetConfig
    upstreams: dict[str, Upstream]
    admissions: dict[str, ModelAdmission]
    metrics: ProxyMetrics
    health_interval: float
    #: Whose keys are accepted, their limits and their usage (`mtpstack.proxy.tenants`).
    tenants: Tenants
    #: Which worker served which conversation, per model; empty under `proxy.routing: first-free`.
    affinities: dict[str, Affinity] = field(default_factory=dict)
    #: One HTTP client (keep-alive pool) per worker, by worker name.
    clients: dict[str, UpstreamClient] = field(default_factory=dict)
    #: The client deadline of every connection `mtpstack proxy` accepts (`mtpstack.proxy.deadline`).
    deadlines: ClientDeadlines | None = None
    draining: bool = False
    started: float = field(default_factory=time.time)


STATE = web.AppKey("state", ProxyState)
