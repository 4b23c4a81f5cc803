"""The proxy app: `create_app(config)` builds an aiohttp application from a `FleetConfig`.

Routes: a POST for each row of the endpoint table (`mtpstack.endpoints`: admitted here, routed, and
relayed to a worker by `mtpstack.proxy.relay`; a row that does not generate, Anthropic's
`count_tokens`, relayed to a healthy worker without a slot), GET /v1/models, /v1/fleet/status, /dashboard,
/healthz, /readyz, /metrics, and the reachability probes `/` and `/api/hello` (`mtpstack.endpoints`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from http import HTTPStatus
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import hdrs, web

from mtpstack.proxy.admission import ModelAdmission, Rejected, Upstream
from mtpstack.proxy.auth import presented_key
from mtpstack.proxy.deadline import ClientDeadlines
from mtpstack.proxy.deadline import middleware as client_deadline_middleware
from mtpstack.proxy.dashboard import dashboard
from mtpstack.proxy import fleet
from mtpstack.proxy.fleet import FLEET, FLEET_INTERVAL_SECONDS, FleetCollector, fleet_ctx
from mtpstack.proxy.health import HEALTH_INTERVAL_SECONDS, health_ctx
from mtpstack.proxy.http import sse_error_event
from mtpstack.proxy.intake import CLIENT_TIMEOUT, choices, not_served, parse, read_body, refuse_what_backends_ignore
from mtpstack.proxy.metrics import ProxyMetrics
from mtpstack.proxy.relay import ClientGone, Exchange, Unsent, relay
from mtpstack.proxy.routing import AFFINITY, DECISIONS, FIRST_FREE_DECISION, Affinity, affinity_keys, decision
from mtpstack.proxy.state import STATE, ProxyState
from mtpstack.proxy.tenants import Tenant, Tenants
from mtpstack.proxy.upstream import UpstreamClient
from mtpstack.endpoints import ENDPOINTS, REACHABILITY_PATHS, Endpoint
from mtpstack.logs import EVENT
from mtpstack.requestid import REQUEST_ID, request_id
from mtpstack.runtime import url_of
from mtpstack.validator import FleetConfig, dial_host, gate_for
from mtpstack.web import error_response, errors_as_json

log = logging.getLogger("mtpstack.proxy")

#: Label for requests whose model is unknown or missing, so a client cannot mint label values.
NO_MODEL = fleet.NO_MODEL
#: Status logged (and counted) when the client went away before its answer: nginx's convention.
CLIENT_CLOSED = 499


def create_app(
    config: FleetConfig, *, health_interval: float = HEALTH_INTERVAL_SECONDS, fleet_interval: float = FLEET_INTERVAL_SECONDS
) -> web.Application:
    """The proxy for `config`. Takes the config as given: the coupling rules are the
    validator's job (`load_valid_config`), so tests can build a deliberately wrong fleet.
    Raises `ApiKeysError` when `proxy.apiKeysFile` is set but unusable."""
    p = config.proxy
    metrics = ProxyMetrics()
    unhealthy_retry_after = max(1, round(health_interval + 0.5))
    upstreams: dict[str, Upstream] = {}
    clients: dict[str, UpstreamClient] = {}
    admissions: dict[str, ModelAdmission] = {}
    for order, (name, w) in enumerate(config.workers.items()):
        host = dial_host(config, name)  # a worker placed on another host: that host's address
        u = Upstream(
            name=name,
            model=w.model,
            url=url_of(host, w.port),
            gate=gate_for(p, w.model),
            rewrite_model=w.target.path if w.backend == "mlx-lm" else None,
            order=order,
        )
        upstreams[name] = u
        clients[name] = UpstreamClient(host, w.port, p.timeouts.connect_seconds)
        metrics.register_upstream(u)
        if w.model not in admissions:
            metrics.register_model(w.model, DECISIONS[p.routing])
            admissions[w.model] = ModelAdmission(
                model=w.model,
                upstreams=[],
                max_waiting=p.queue.max_waiting,
                timeout_seconds=p.queue.timeout_seconds,
                unhealthy_retry_after=unhealthy_retry_after,
                observer=metrics,
                prefer_wait_seconds=p.affinity_wait_seconds if p.routing == AFFINITY else 0.0,
            )
        admissions[w.model].upstreams.append(u)
    state = ProxyState(
        config=config,
        upstreams=upstreams,
        admissions=admissions,
        metrics=metrics,
        health_interval=health_interval,
        tenants=Tenants(config),
        clients=clients,
        affinities={m: Affinity() for m in admissions} if p.routing == AFFINITY else {},
    )

    state.deadlines = ClientDeadlines(p.timeouts.client_seconds, lambda peer: _late_head(state, peer))
    app = web.Application(middlewares=[errors_as_json("proxy"), client_deadline_middleware(lambda a: a[STATE].deadlines)])
    app[STATE] = state
    app[FLEET] = FleetCollector(state, fleet_interval)
    app.cleanup_ctx.append(_clients_ctx)
    app.cleanup_ctx.append(health_ctx)
    app.cleanup_ctx.append(fleet_ctx)
    app.on_shutdown.append(_start_draining)
    # The only paths forwarded to workers; anything else is answered by the proxy itself.
    for endpoint in ENDPOINTS:
        app.router.add_post(endpoint.path, forwarder(endpoint))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_get("/v1/fleet/status", fleet_status)
    app.router.add_get("/dashboard", dashboard)
    app.router.add_get("/healthz", healthz)
    for path in REACHABILITY_PATHS:  # clients' probes (Claude Code's `HEAD /api/hello`): the proxy answers
        app.router.add_get(path, healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app


async def _clients_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    for client in app[STATE].clients.values():
        client.close()


async def _start_draining(app: web.Application) -> None:
    # The listening socket is closed by now; in-flight requests (queued ones included) go on.
    app[STATE].draining = True


# -- small endpoints ---------------------------------------------------------------------
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    models = {
        m: {"healthy_workers": sum(u.healthy for u in a.upstreams), "workers": len(a.upstreams), "waiting": a.waiting}
        for m, a in state.admissions.items()
    }
    workers = {
        u.name: {"model": u.model, "healthy": u.healthy, "detail": u.health_detail, "inflight": u.inflight, "gate": u.gate}
        for u in state.upstreams.values()
    }
    ready = not state.draining and all(v["healthy_workers"] > 0 for v in models.values())
    status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
    return web.json_response({"ready": ready, "draining": state.draining, "models": models, "workers": workers}, status=status)


async def metrics_handler(request: web.Request) -> web.Response:
    m = request.app[STATE].metrics
    resp = web.Response(body=m.render())
    resp.headers[hdrs.CONTENT_TYPE] = m.content_type
    return resp


def _auth_failure(request: web.Request, state: ProxyState, rid: str, family: str = "openai") -> web.Response | None:
    return None if _tenant_of(request, state) is not None else _unauthorized(rid, family)


def _tenant_of(request: web.Request, state: ProxyState) -> Tenant | None:
    """The tenant whose key the request carries (`default` when no keys file is set), or None."""
    return state.tenants.lookup(presented_key(request.headers))


def _unauthorized(rid: str, family: str) -> web.Response:
    # Names no tenant: whoever sent a wrong key learns nothing of anyone's.
    return error_response(
        HTTPStatus.UNAUTHORIZED, "invalid_api_key", "missing or wrong API key; send `Authorization: Bearer KEY` or `x-api-key: KEY`",
        rid=rid,
        family=family,
    )


def _keyed(handler: Callable[[web.Request, ProxyState, str], Awaitable[web.Response]]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An API route answered by the proxy itself: behind the API key like the forwarded ones."""

    async def route(request: web.Request) -> web.Response:
        state = request.app[STATE]
        rid = request_id(request.headers)
        denied = _auth_failure(request, state, rid)
        return denied if denied is not None else await handler(request, state, rid)

    return route




def _model_object(state: ProxyState, model: str) -> dict:
    return {"id": model, "object": "model", "created": int(state.started), "owned_by": "mtpstack"}


@_keyed
async def list_models(request: web.Request, state: ProxyState, rid: str) -> web.Response:
    data = [_model_object(state, m) for m in state.admissions]
    return web.json_response({"object": "list", "data": data}, headers={REQUEST_ID: rid})


@_keyed
async def get_model(request: web.Request, state: ProxyState, rid: str) -> web.Response:
    """One entry of `/v1/models` (OpenAI's `models.retrieve`), or a JSON 404 naming the served models."""
    model = request.match_info["model"]
    if model not in state.admissions:
        return error_response(HTTPStatus.NOT_FOUND, "model_not_found", not_served(state, model), rid=rid)
    return web.json_response(_model_object(state, model), headers={REQUEST_ID: rid})


@_keyed
async def fleet_status(request: web.Request, state: ProxyState, rid: str) -> web.Response:
    """The last snapshot of `mtpstack.proxy.fleet`: no worker is asked on a reader's behalf."""
    return web.Response(
        body=request.app[FLEET].body,
        content_type="application/json",
        headers={REQUEST_ID: rid, hdrs.CACHE_CONTROL: "no-store"},
    )


# -- the forwarded requests --------------------------------------------------------------
def forwarder(endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The route of one row of the endpoint table."""

    async def route(request: web.Request) -> web.StreamResponse:
        return await forward(request, endpoint)

    return route


async def forward(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    """Admit the request to a worker of its model and relay the answer. Every request gets
    exactly one answer: the worker's, or one error of the proxy's own."""
    state = request.app[STATE]
    ex = Exchange(rid=request_id(request.headers), path=request.path, arrived=time.monotonic(), endpoint=endpoint)
    try:
        resp = await _forward(request, state, ex, endpoint)
    except Rejected as r:
        ex.code = r.code
        resp = error_response(r.status, r.code, r.message, rid=ex.rid, retry_after=r.retry_after, family=endpoint.family)
        if r.code == CLIENT_TIMEOUT:
            resp.force_close()  # the rest of the body may still be on its way: do not wait for it
    except asyncio.CancelledError:
        _client_left(ex)
        _finish(state, ex)
        raise
    except ClientGone as gone:
        _client_left(ex)
        _finish(state, ex)
        return gone.response
    except Exception:
        log.exception("unexpected error in request %s", ex.rid)
        ex.code = "internal_error"
        if ex.stream_response is not None:
            resp = ex.stream_response
            try:
                await resp.write(sse_error_event("internal_error", "the proxy failed on this stream", endpoint))
                await resp.write_eof()
            except Exception:  # the connection is beyond repair; aiohttp closes it
                pass
        else:
            resp = error_response(HTTPStatus.INTERNAL_SERVER_ERROR, "internal_error", "the proxy failed on this request",
                                  rid=ex.rid, family=endpoint.family)
    transport = request.transport
    if not resp.prepared and (transport is None or transport.is_closing()):
        # The answer is ready but its client is gone: it will never be delivered.
        ex.status, ex.code = CLIENT_CLOSED, ex.code or "client_closed"
    else:
        ex.status = resp.status
    _finish(state, ex)
    return resp


def _client_left(ex: Exchange) -> None:
    """The client closed its connection before the proxy was done: a 499, unless its stream's final
    event had gone out (`Exchange.delivered`). Agent clients close as soon as they read it, while the
    worker may still have the stream's end to send; the answer was delivered all the same."""
    if ex.stream_response is not None and ex.delivered():
        ex.status = ex.stream_response.status
    else:
        ex.status, ex.code = CLIENT_CLOSED, ex.code or "client_closed"


def _finish(state: ProxyState, ex: Exchange) -> None:
    state.metrics.count_request(ex.model, ex.status)
    tenant = ex.tenant
    if tenant is not None:
        used = ex.used()
        if used is not None:
            tenant.charge(time.monotonic(), *used)
        state.tenants.finished(tenant, ex.status, ex.queue_wait)
        state.metrics.count_tenant(tenant.name, ex.status, ex.queue_wait, used)
    # An error answered, or a stream the proxy ended with an error event (its status was 200).
    if ex.code is not None and ex.status != CLIENT_CLOSED:
        state.metrics.count_refusal(ex.model, ex.code)
    if log.isEnabledFor(logging.INFO):
        # Written once the answer is out: aiohttp sends a plain answer after the handler returns,
        # in the same loop turn, and a callback waits for the turn's end.
        asyncio.get_running_loop().call_soon(_log_line, ex, time.monotonic())


def _log_line(ex: Exchange, now: float) -> None:
    log.info(ex.line(now), extra=EVENT)


def _late_head(state: ProxyState, peer) -> None:
    """A client sent part of a request head and not the rest within the deadline: its
    connection is closed without an answer (none can be framed), and logged as 408."""
    seconds = state.config.proxy.timeouts.client_seconds
    now = time.monotonic()
    ex = Exchange(rid=uuid.uuid4().hex, path=None, arrived=now - seconds, status=HTTPStatus.REQUEST_TIMEOUT, code=CLIENT_TIMEOUT)
    _finish(state, ex)




async def _forward(request: web.Request, state: ProxyState, ex: Exchange, endpoint: Endpoint) -> web.StreamResponse:
    tenant = _tenant_of(request, state)
    if tenant is None:
        ex.code = "invalid_api_key"
        return _unauthorized(ex.rid, endpoint.family)
    ex.tenant = tenant
    p = state.config.proxy
    body = await read_body(request, p.max_body_bytes, p.timeouts.client_seconds)
    payload, ex.model = parse(body, state)
    ex.stream = payload.get("stream") is True
    admission = state.admissions[ex.model]
    refuse_what_backends_ignore(state, admission, endpoint, payload, ex.model)
    if not endpoint.generates:
        upstream = _least_busy_healthy(admission)
        ex.worker = upstream.name
        return await relay(request, state, upstream, body, ex)
    weight = choices(payload, endpoint, admission)
    tenant.admit(time.monotonic(), admission.retry_after)  # its limits: a 429 of its own
    try:
        return await _admitted(request, state, ex, endpoint, payload, body, admission, tenant, weight)
    finally:
        tenant.inflight -= 1


async def _admitted(request: web.Request, state: ProxyState, ex: Exchange, endpoint: Endpoint, payload: dict, body: bytes,
                    admission: ModelAdmission, tenant: Tenant, weight: int) -> web.StreamResponse:
    """A generating request within its tenant's limits: a slot on a worker of its model (in its
    tenant's turn), the answer relayed, and on to another worker if its own never took it."""
    affinity = state.affinities.get(ex.model)
    keys = affinity_keys(endpoint.path, payload) if affinity is not None else None
    preferred = affinity.preferred(keys.lookup) if keys is not None else None
    # Fair queueing off: every request in one tenant's line, first come first served.
    turn = (tenant.name, tenant.weight) if state.config.proxy.fair_queueing else ("", 1)
    queued = time.monotonic()
    try:
        upstream = await admission.acquire(state.upstreams[preferred] if preferred is not None else None, weight,
                                           tenant=turn[0], share=turn[1])
    finally:
        ex.queue_wait = time.monotonic() - queued
        state.metrics.observe_queue_wait(ex.model, ex.queue_wait)
    _routed(state, ex, upstream, affinity, keys, preferred)
    while True:
        admitted = time.monotonic()
        unsent = None
        try:
            if upstream.rewrite_model is not None:
                payload["model"] = upstream.rewrite_model
                return await relay(request, state, upstream, json.dumps(payload).encode(), ex)
            return await relay(request, state, upstream, body, ex)
        except Unsent as e:
            unsent = e
        finally:
            admission.release(upstream, None if unsent is not None else time.monotonic() - admitted, weight)
        upstream = await _failover(state, admission, ex, upstream, unsent, weight, affinity, keys)


def _routed(state: ProxyState, ex: Exchange, upstream: Upstream, affinity: Affinity | None, keys, preferred: str | None) -> None:
    """The request goes to `upstream`: logged, counted, and remembered for its conversation."""
    ex.worker = upstream.name
    if keys is not None:
        # The conversation now lives where this request goes, wherever it lived before; a beginning
        # other conversations share, once that worker holds it (`Keys.shared`).
        affinity.remember(keys.recorded_at_admission, upstream.name)
        ex.on_held = None if keys.shared is None else lambda: affinity.remember([keys.shared], upstream.name)
        ex.routing = decision(preferred, upstream.name)
    else:
        ex.routing = FIRST_FREE_DECISION
    state.metrics.count_routing(ex.model, ex.routing)


async def _failover(state: ProxyState, admission: ModelAdmission, ex: Exchange, failed: Upstream, unsent: Unsent, weight: int,
                    affinity: Affinity | None, keys) -> Upstream:
    """`failed` never took the request and is marked unhealthy (`relay`): another healthy worker of
    the model gets it, ahead of the requests that arrived after it (or it waits for one, first in
    line). With none healthy, or each worker tried once, the answer is the failure itself."""
    ex.failed_over = [*(ex.failed_over or ()), failed.name]
    if not admission.healthy or len(ex.failed_over) >= len(admission.upstreams):
        raise unsent.rejected
    state.metrics.failover(failed.name)
    preferred = affinity.preferred(keys.lookup) if keys is not None else None  # the failed worker's are forgotten
    log.info(json.dumps({"event": "failover", "request_id": ex.rid, "from": failed.name, "reason": unsent.rejected.message}))
    queued = time.monotonic()
    try:
        upstream = await admission.acquire(state.upstreams[preferred] if preferred is not None else None, weight, retry=True)
    finally:
        waited = time.monotonic() - queued
        ex.queue_wait = (ex.queue_wait or 0.0) + waited
        state.metrics.observe_queue_wait(ex.model, waited)
    _routed(state, ex, upstream, affinity, keys, preferred)
    return upstream


def _least_busy_healthy(admission: ModelAdmission) -> Upstream:
    """The least busy healthy worker of a model, for a request that takes no slot (it generates nothing)."""
    healthy = [u for u in admission.upstreams if u.healthy]
    if not healthy:
        raise Rejected(HTTPStatus.SERVICE_UNAVAILABLE, "no_healthy_worker",
                       f"no healthy worker serves model `{admission.model}` right now", retry_after=admission.unhealthy_retry_after)
    return min(healthy, key=lambda u: (u.inflight / u.gate, u.order))
