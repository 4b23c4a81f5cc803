"""Prometheus metrics of one proxy app, in the app's own registry (so tests can build many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mtpstack.proxy.admission import Upstream

PREFIX = "mtpstack_proxy_"

#: Queue waits span a free slot (0) to the queue timeout (tens of seconds).
QUEUE_WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: First bytes span a streamed token (milliseconds) to a long non-streamed generation (minutes).
FIRST_BYTE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ProxyMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(f"{PREFIX}requests_total", "Requests answered, by model and HTTP status.", ["model", "status"], registry=r)
        self.queue_depth = Gauge(f"{PREFIX}queue_depth", "Requests waiting for a slot, by model.", ["model"], registry=r)
        self.queue_wait = Histogram(
            f"{PREFIX}queue_wait_seconds", "Time from arrival to a slot (or to rejection), by model.", ["model"],
            buckets=QUEUE_WAIT_BUCKETS, registry=r,
        )
        self.inflight = Gauge(f"{PREFIX}inflight", "Requests admitted to a worker and not yet finished; never above the gate.", ["worker"], registry=r)
        self.gate = Gauge(f"{PREFIX}gate", "Admission gate of a worker: the most requests it is sent at once.", ["worker"], registry=r)
        self.first_byte = Histogram(
            f"{PREFIX}upstream_first_byte_seconds", "Time from sending a request to a worker to its response headers.", ["worker"],
            buckets=FIRST_BYTE_BUCKETS, registry=r,
        )
        self.first_token = Histogram(
            f"{PREFIX}time_to_first_token_seconds",
            "Time from sending a streamed request to a worker to its first content chunk, by worker.", ["worker"],
            buckets=FIRST_BYTE_BUCKETS, registry=r,
        )
        self.refusals = Counter(
            f"{PREFIX}refusals_total", "Requests the proxy answered with an error of its own, or whose stream it ended with an error event "
            "(a worker lost mid-stream: status 200, yet failed), by model and error code.",
            ["model", "code"], registry=r,
        )
        #: The same counts as `refusals`, by model then code, for `/v1/fleet/status`.
        self.refused: dict[str, dict[str, int]] = {}
        self.routing = Counter(
            f"{PREFIX}routing_total",
            "Requests admitted, by model and how their worker was chosen: affinity (the worker that served the "
            "conversation), fallback_busy (that worker was full: another), new (none remembered), first_free.",
            ["model", "decision"], registry=r,
        )
        #: The same counts as `routing`, by model then decision, for `/v1/fleet/status`.
        self.routed: dict[str, dict[str, int]] = {}
        self.healthy = Gauge(f"{PREFIX}worker_healthy", "1 when the worker passed its last health check, else 0.", ["worker"], registry=r)
        self.upstream_errors = Counter(
            f"{PREFIX}upstream_errors_total", "Failed exchanges with a worker, by kind.", ["worker", "code"], registry=r
        )
        self.failovers = Counter(
            f"{PREFIX}failovers_total",
            "Requests a worker never took (refused, reset before reading it, no connection), sent on to another "
            "worker of the model, by the worker that failed.", ["worker"], registry=r,
        )
        t = ["tenant"]
        self.tenant_requests = Counter(f"{PREFIX}tenant_requests_total", "Requests answered, by tenant (whose key) and HTTP status.",
                                       ["tenant", "status"], registry=r)
        self.tenant_prompt = Counter(f"{PREFIX}tenant_prompt_tokens_total",
                                     "Prompt tokens of the tenant's requests, those served from a prefix cache included (the worker's usage).", t, registry=r)
        self.tenant_cached = Counter(f"{PREFIX}tenant_cached_tokens_total", "Prompt tokens of the tenant's requests served from a prefix cache.", t, registry=r)
        self.tenant_completion = Counter(f"{PREFIX}tenant_completion_tokens_total",
                                         "Completion tokens the tenant's clients were sent (the worker's usage).", t, registry=r)
        self.tenant_queue = Counter(f"{PREFIX}tenant_queue_seconds_total", "Seconds the tenant's requests waited for a slot.", t, registry=r)

        #: Resolved label children: `labels()` costs a lock and a dict build per call, and label
        #: values here come from the config (or a status code), so the set is small and fixed.
        self._children: dict[tuple, object] = {}

    def _child(self, metric, *labels: str):
        key = (metric._name, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count_request(self, model: str, status: int) -> None:
        self._child(self.requests, model, str(status)).inc()

    def count_tenant(self, tenant: str, status: int, queue_seconds: float | None, used: tuple[int, int, int] | None) -> None:
        self._child(self.tenant_requests, tenant, str(status)).inc()
        if queue_seconds:
            self._child(self.tenant_queue, tenant).inc(queue_seconds)
        if used is not None:
            prompt, cached, completion = used
            self._child(self.tenant_prompt, tenant).inc(prompt)
            self._child(self.tenant_cached, tenant).inc(cached)
            self._child(self.tenant_completion, tenant).inc(completion)

    def count_refusal(self, model: str, code: str) -> None:
        self._child(self.refusals, model, code).inc()
        by_code = self.refused.setdefault(model, {})
        by_code[code] = by_code.get(code, 0) + 1

    def count_routing(self, model: str, decision: str) -> None:
        self._child(self.routing, model, decision).inc()
        by_decision = self.routed.setdefault(model, {})
        by_decision[decision] = by_decision.get(decision, 0) + 1

    def routing_counts(self, model: str) -> dict[str, int]:
        return dict(self.routed.get(model, {}))

    def refusal_counts(self) -> dict[str, dict[str, int]]:
        return {model: dict(codes) for model, codes in self.refused.items()}

    def observe_first_token(self, worker: str, seconds: float) -> None:
        self._child(self.first_token, worker).observe(seconds)

    def observe_queue_wait(self, model: str, seconds: float) -> None:
        self._child(self.queue_wait, model).observe(seconds)

    def observe_first_byte(self, worker: str, seconds: float) -> None:
        self._child(self.first_byte, worker).observe(seconds)

    def upstream_error(self, worker: str, code: str) -> None:
        self._child(self.upstream_errors, worker, code).inc()

    def failover(self, worker: str) -> None:
        self._child(self.failovers, worker).inc()

    def set_healthy(self, worker: str, healthy: bool) -> None:
        self._child(self.healthy, worker).set(1 if healthy else 0)

    def register_upstream(self, upstream: Upstream) -> None:
        self.gate.labels(upstream.name).set(upstream.gate)
        self.inflight.labels(upstream.name).set(0)
        self.healthy.labels(upstream.name).set(0)
        self.failovers.labels(upstream.name)

    def register_model(self, model: str, decisions: tuple[str, ...] = ()) -> None:
        self.queue_depth.labels(model).set(0)
        for d in decisions:  # every series from the start, at 0, so a rate is defined before the first request
            self._child(self.routing, model, d)
            self.routed.setdefault(model, {})[d] = 0

    # AdmissionObserver
    def inflight_changed(self, upstream: Upstream) -> None:
        self._child(self.inflight, upstream.name).set(upstream.inflight)

    def queue_changed(self, model: str, depth: int) -> None:
        self._child(self.queue_depth, model).set(depth)

    def render(self) -> bytes:
        return generate_latest(self.registry)
