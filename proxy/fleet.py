"""The fleet's state as `GET /v1/fleet/status` and `/dashboard` show it, collected by one
background task once a second, however many pages or scripts read it.

Each second the task asks every worker for `/identity` and `/metrics` (two small GETs, on the
proxy's own keep-alive pool) and keeps what it needs to show trends: 15 minutes of per-model
load, and a minute of per-worker throughput and time to first token. Readers get the last
snapshot, serialized once per collection, so a page polling costs the proxy one cached write.

A restart is seen as a change of the pid or start time `/identity` reports, so it is counted the
same under `mtpstack up`, systemd and launchd. Whether it took the worker's prefix cache with it is
the cache's own id's to say (`prefix_cache.id`, its disk tier's): the same id, and the conversations
routed to it stay routed to it (`proxy.routing`). The weights a worker reports are checked against
the command line its config implies (`validator.worker_argv`), and its batch width against the
proxy's gate: a worker restarted by hand with another `--max-num-seqs` is flagged on both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterable

from aiohttp import web

from mtpstack import series
from mtpstack.proxy.admission import Upstream
from mtpstack.proxy.health import forget_worker
from mtpstack.proxy.prometheus import Samples, labelled, parse_samples, sample
from mtpstack.proxy.routing import hit_rate
from mtpstack.proxy.state import ProxyState
from mtpstack.proxy.upstream import UpstreamClient, UpstreamError
from mtpstack.validator import DEPTH_AUTO, WorkerProfile, worker_argv
from mtpstack.validator import identity_disagreements, weights_from_argv

log = logging.getLogger("mtpstack.proxy")

#: Version of the JSON shape; raised on any change a script could trip over.
SCHEMA_VERSION = 1
#: One collection a second: a page refreshing once a second sees every change, and two small
#: GETs per worker per second cost nothing next to a generation.
FLEET_INTERVAL_SECONDS = 1.0
#: Per-model load is kept for the last 15 minutes (one sample per collection).
HISTORY_SECONDS = 15 * 60
#: tok/s and time to first token are shown as median and spread over the last minute: long
#: enough to hold several requests, short enough to follow a change of load.
WINDOW_SECONDS = 60.0
#: `/identity` and `/metrics` answer from the worker's HTTP thread within milliseconds; a worker
#: silent for longer is shown as unreachable for this round rather than stalling the others.
FETCH_TIMEOUT_SECONDS = 2.0
#: Hash prefix shown for each weight file set: enough to tell two apart at a glance.
HASH_PREFIX = 12
#: The model label of requests refused before a served model was known (`mtpstack.proxy.app.NO_MODEL`).
NO_MODEL = "-"
#: Time-to-first-token samples kept per worker (the window also bounds them).
TTFT_SAMPLES = 1000


def spread(values: Iterable[float]) -> dict | None:
    """Median with min and max and the count; None when there is nothing to summarise."""
    vs = list(values)
    if not vs:
        return None
    return {"median": statistics.median(vs), "min": min(vs), "max": max(vs), "n": len(vs)}


def _by_position(samples: Samples, name: str) -> dict[int, float]:
    return {int(labels["position"]): value for labels, value in labelled(samples, name) if labels.get("position", "").isdigit()}


def acceptance(samples: Samples) -> dict:
    """Acceptance overall and by draft position from a worker's counters. A position's rate is
    accepted over drafted at that position, when the worker reports drafts by position."""
    drafted, accepted = sample(samples, series.TOKENS_DRAFTED), sample(samples, series.TOKENS_ACCEPTED)
    by_acc = _by_position(samples, series.ACCEPTED_BY_POSITION)
    by_drafted = _by_position(samples, series.DRAFTED_BY_POSITION)
    positions = []
    for p in sorted(set(by_acc) | set(by_drafted)):
        d = by_drafted.get(p)
        a = by_acc.get(p, 0.0)
        positions.append({"position": p, "accepted": a, "drafted": d, "rate": (a / d) if d else None})
    return {
        "drafted": drafted,
        "accepted": accepted,
        "rate": (accepted / drafted) if drafted and accepted is not None else None,
        "by_position": positions,
    }


#: The worker's prefix-cache series (`mtpstack_worker_prefix_cache_*`), by the key the status shows them under.
PREFIX_CACHE_SERIES = {
    "lookups": series.PREFIX_CACHE_LOOKUPS,
    "hits": series.PREFIX_CACHE_HITS,
    "tokens_reused": series.PREFIX_CACHE_TOKENS_REUSED,
    "evictions": series.PREFIX_CACHE_EVICTIONS,
    "bytes": series.PREFIX_CACHE_BYTES,
    "disk_hits": series.PREFIX_CACHE_DISK_HITS,
    "disk_errors": series.PREFIX_CACHE_DISK_ERRORS,
    "disk_bytes": series.PREFIX_CACHE_DISK_BYTES,
}


def prefix_cache(samples: Samples) -> dict | None:
    """The worker's prefix cache from its counters, with its hit rate (hits over lookups) and its
    disk tier's (lookups resumed from disk; the disk fields are None without a disk tier); None
    when the worker exports no prefix cache (mlx_lm.server, or one without it)."""
    values = {key: sample(samples, name) for key, name in PREFIX_CACHE_SERIES.items()}
    if values["lookups"] is None:
        return None
    hits, lookups, disk = values["hits"], values["lookups"], values["disk_hits"]
    return {**values, "hit_rate": (hits / lookups) if lookups and hits is not None else None,
            "disk_hit_rate": (disk / lookups) if lookups and disk is not None else None}


def draft_depth(samples: Samples) -> int | None:
    """The depth of the loaded drafter, from `mtpstack_worker_drafter_info`."""
    for labels, value in labelled(samples, series.DRAFTER_INFO):
        if value and labels.get("depth", "").isdigit():
            return int(labels["depth"])
    return None


def _by_label(samples: Samples, name: str, label: str) -> dict[int, float]:
    return {int(labels[label]): value for labels, value in labelled(samples, name) if labels.get(label, "").isdigit()}


def live_depth(samples: Samples) -> dict | None:
    """The depth the worker's decode steps run at and why: the last step's, each decoding row's in it,
    the steps by depth, and, where a depth is `auto`, what its policy chose from (its acceptance
    estimate per position, a verify step's measured seconds per depth). None for a worker without the
    series (mlx_lm.server, an older mtpstack)."""
    depth = sample(samples, series.DRAFT_DEPTH)
    if depth is None:
        return None
    rows = _by_label(samples, series.DRAFT_DEPTH_BY_ROW, "row")
    estimate = _by_label(samples, series.DRAFT_ACCEPTANCE_ESTIMATE, "position")
    return {
        "depth": int(depth),
        "rows": [int(rows[r]) for r in sorted(rows)],
        "steps_by_depth": {str(d): n for d, n in sorted(_by_label(samples, series.DRAFT_DEPTH_STEPS, "depth").items())},
        "acceptance_estimate": [estimate[p] for p in sorted(estimate)],
        "step_seconds": {str(d): v for d, v in sorted(_by_label(samples, series.VERIFY_STEP_SECONDS, "depth").items())},
    }


def _model_summary(identity_model: dict | None) -> dict | None:
    if not identity_model:
        return None
    sha = identity_model.get("sha256") or ""
    return {
        "path": identity_model.get("path"),
        "bits": identity_model.get("bits"),
        "kind": identity_model.get("kind"),
        "hash": sha[:HASH_PREFIX] or None,
        "bits_mismatch": identity_model.get("bits_mismatch"),
    }


def weights_check(profile: WorkerProfile, identity: dict) -> list[str]:
    """How the worker disagrees with the command line the config implies (`worker_argv(profile)`):
    its `/identity`, the bits it found against its config.json, and its own argv (`/identity`'s
    `argv`). One sentence per disagreement; empty when they agree. The draft depths are left out:
    they are the worker's own tuning, and an edit of them restarts the worker but not the proxy
    (docs/nix.md), whose copy of the config then holds the old ones."""
    want = weights_from_argv(worker_argv(profile))
    found = identity_disagreements(want, identity, "config", profile.drafter.kind if profile.drafter else None, depths=False)
    for role in ("target", "drafter"):
        mismatch = (identity.get(role) or {}).get("bits_mismatch")
        if mismatch:
            found.append(f"{role} bits: {mismatch}")
    argv = identity.get("argv")
    if isinstance(argv, list) and argv:
        try:
            ran = weights_from_argv(argv)
        except ValueError:
            found.append("the worker's own command line is not a worker's")
        else:
            for what, a, b in (("target", want.target, ran.target), ("drafter", want.drafter, ran.drafter),
                               ("maxNumSeqs", want.max_num_seqs, ran.max_num_seqs)):
                if a != b:
                    found.append(f"{what}: config `{a}`, its own command line `{b}`")
    return found


def cache_id_of(identity: dict) -> str | None:
    """The id of a worker's prefix cache that outlives the process (its disk tier's), from `/identity`."""
    cache = identity.get("prefix_cache")
    value = cache.get("id") if isinstance(cache, dict) else None
    return value if isinstance(value, str) and value else None


@dataclass
class WorkerTrack:
    """What the collector remembers about one worker between rounds."""

    pid: int | None = None
    started_at: float | None = None
    restarts: int = 0
    identity: dict | None = None
    identity_error: str | None = None
    samples: Samples = field(default_factory=dict)
    metrics_error: str | None = None
    last_generated: tuple[float, float] | None = None  # (monotonic time, tokens generated)
    rates: deque = field(default_factory=lambda: deque(maxlen=int(WINDOW_SECONDS) + 1))  # (time, tok/s)
    ttft: deque = field(default_factory=lambda: deque(maxlen=TTFT_SAMPLES))  # (time, seconds)

    def saw_identity(self, identity: dict) -> bool:
        """Record an `/identity`; True when it shows a restart (a new pid or start time)."""
        pid, started = identity.get("pid"), identity.get("started_at")
        restarted = self.pid is not None and (pid, started) != (self.pid, self.started_at)
        if restarted:
            self.restarts += 1
            self.last_generated = None  # its counters started again from zero
        self.pid, self.started_at, self.identity, self.identity_error = pid, started, identity, None
        return restarted

    def saw_generated(self, now: float, total: float) -> None:
        if self.last_generated is not None:
            t0, n0 = self.last_generated
            # Idle seconds are left out: a median of mostly zeros would hide the speed it generates at.
            if now > t0 and total > n0:
                self.rates.append((now, (total - n0) / (now - t0)))
        self.last_generated = (now, total)


async def _get(client: UpstreamClient, path: str) -> tuple[int, bytes]:
    resp = None
    try:
        async with asyncio.timeout(FETCH_TIMEOUT_SECONDS):
            resp = await client.request("GET", path, [])
            return resp.status, await resp.read_all()
    finally:
        if resp is not None:
            resp.close()


class FleetCollector:
    """Collects the fleet's state once per `interval`; `body` is the last snapshot as JSON bytes."""

    def __init__(self, state: ProxyState, interval: float = FLEET_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.state = state
        self.interval = interval
        self.clock = clock
        self.tracks = {name: WorkerTrack() for name in state.upstreams}
        self.history = {model: deque(maxlen=max(1, int(HISTORY_SECONDS / interval))) for model in state.admissions}
        self.rounds = 0
        self.snapshot: dict = {}
        self.body = b"{}"

    def first_token(self, worker: str, seconds: float) -> None:
        """A stream's first content chunk reached the proxy `seconds` after it sent the request."""
        self.tracks[worker].ttft.append((self.clock(), seconds))

    async def _collect_worker(self, upstream: Upstream) -> None:
        track = self.tracks[upstream.name]
        client = self.state.clients[upstream.name]
        profile = self.state.config.workers[upstream.name]
        if profile.backend != "native":
            # mlx_lm.server has neither route, and logs every request it answers: asking once a
            # second would only fill its log with 404s.
            track.identity_error = "mlx_lm.server has no /identity"
            track.metrics_error = "mlx_lm.server has no /metrics"
            return
        try:
            status, body = await _get(client, "/identity")
            if status == 200:
                identity = json.loads(body)
                cache_id = cache_id_of(identity)
                if track.saw_identity(identity):
                    kept = upstream.cache_id is not None and cache_id == upstream.cache_id
                    if not kept:
                        forget_worker(self.state, upstream)
                    log.info(json.dumps({"event": "worker_restarted", "worker": upstream.name, "pid": track.pid,
                                         "prefix_cache_kept": kept}))
                elif upstream.cache_id is not None and cache_id != upstream.cache_id:
                    forget_worker(self.state, upstream)  # the same process, another cache: never the old one's
                upstream.cache_id = cache_id
            else:
                track.identity_error = f"/identity answered {status}"
        except (UpstreamError, TimeoutError, ValueError) as e:
            track.identity_error = f"/identity: {_why(e)}"
        try:
            status, body = await _get(client, "/metrics")
            if status == 200:
                track.samples = parse_samples(body.decode(), strict=True)
                track.metrics_error = None
                generated = sample(track.samples, series.TOKENS_GENERATED)
                if generated is not None:
                    track.saw_generated(self.clock(), generated)
            else:
                track.metrics_error = f"/metrics answered {status}"
        except (UpstreamError, TimeoutError, ValueError) as e:
            track.metrics_error = f"/metrics: {_why(e)}"

    async def collect(self) -> dict:
        """One round: ask every worker, then rebuild the snapshot."""
        await asyncio.gather(*(self._collect_worker(u) for u in self.state.upstreams.values()))
        now = self.clock()
        for model, a in self.state.admissions.items():
            self.history[model].append((now, sum(u.inflight for u in a.upstreams), a.waiting))
        self.rounds += 1
        self.snapshot = self.build(now)
        self.body = json.dumps(self.snapshot).encode()
        return self.snapshot

    def build(self, now: float) -> dict:
        state = self.state
        problems: list[str] = []
        workers = {}
        for name, u in state.upstreams.items():
            w = self._worker(name, u, now)
            workers[name] = w
            if not w["healthy"]:
                problems.append(f"worker `{name}` is unhealthy: {w['health_detail']}")
            if w["coupling"]["agrees"] is False:
                problems.append(f"worker `{name}`: {w['coupling']['detail']}")
            for m in w["weights"]["mismatches"]:
                problems.append(f"worker `{name}` weights: {m}")
        refusals = state.metrics.refusal_counts()
        tenants, not_shown = state.tenants.snapshot()
        models = {}
        for model, a in state.admissions.items():
            recent = [s for s in self.history[model] if now - s[0] <= HISTORY_SECONDS]
            models[model] = {
                "gate": [u.gate for u in a.upstreams],
                "capacity": sum(u.gate for u in a.upstreams),
                "workers": [u.name for u in a.upstreams],
                "healthy_workers": sum(u.healthy for u in a.upstreams),
                "inflight": sum(u.inflight for u in a.upstreams),
                "queued": a.waiting,
                "last_15m": {"inflight": spread(s[1] for s in recent), "queued": spread(s[2] for s in recent)},
                "refusals": refusals.get(model, {}),
                "routing": self._routing(model),
            }
        return {
            "schema": SCHEMA_VERSION,
            "generated_at": time.time(),
            "interval_seconds": self.interval,
            "window_seconds": WINDOW_SECONDS,
            "history_seconds": HISTORY_SECONDS,
            "rounds": self.rounds,
            "draining": state.draining,
            "ok": not problems,
            "problems": problems,
            "models": models,
            # Refused before a served model was known (no key, bad JSON, an unknown model...).
            "refusals_without_model": refusals.get(NO_MODEL, {}),
            "tenants": tenants,
            "tenants_not_shown": not_shown,
            "workers": workers,
        }

    def _routing(self, model: str) -> dict:
        counts = self.state.metrics.routing_counts(model)
        return {"policy": self.state.config.proxy.routing, "decisions": counts, "hit_rate": hit_rate(counts)}

    def _worker(self, name: str, u: Upstream, now: float) -> dict:
        track = self.tracks[name]
        profile = self.state.config.workers[name]
        identity = track.identity or {}
        samples = track.samples
        width = identity.get("max_num_seqs")
        if width is None:
            coupling = {"gate": u.gate, "width": None, "agrees": None, "detail": track.identity_error or "width not reported yet"}
        elif width == u.gate:
            coupling = {"gate": u.gate, "width": width, "agrees": True, "detail": "the gate equals the worker's width"}
        else:
            coupling = {
                "gate": u.gate, "width": width, "agrees": False,
                "detail": f"the proxy's gate is {u.gate} but the worker serves {width} at once (`--max-num-seqs {width}`)",
            }
        mismatches = weights_check(profile, identity) if track.identity else []
        active = sample(samples, series.ACTIVE_SEQUENCES)
        started = track.started_at
        return {
            "model": u.model,
            "backend": profile.backend,
            "url": u.url,
            "healthy": u.healthy,
            "health_detail": u.health_detail,
            "inflight": u.inflight,
            "gate": u.gate,
            "pid": track.pid,
            "started_at": started,
            "uptime_seconds": (time.time() - started) if started else None,
            "restarts": track.restarts,
            "identity_error": track.identity_error,
            "metrics_error": track.metrics_error,
            "weights": {
                "target": _model_summary(identity.get("target")),
                "drafter": _model_summary(identity.get("drafter")),
                "expected_argv": worker_argv(profile),
                "checked": bool(track.identity),
                "agrees": (not mismatches) if track.identity else None,
                "mismatches": mismatches,
            },
            "width": {"max_num_seqs": width, "active": None if active is None else int(active)},
            # `auto` as the worker says it (its drafter is loaded at maxDepth, which the series would show).
            "draft_depth": identity.get("draft_depth") if identity.get("draft_depth") == DEPTH_AUTO
            else draft_depth(samples) or identity.get("draft_depth"),
            "live_depth": live_depth(samples),
            "acceptance": acceptance(samples),
            "prefix_cache": prefix_cache(samples),
            "tokens_per_second": spread(r for t, r in track.rates if now - t <= WINDOW_SECONDS),
            "time_to_first_token_seconds": spread(s for t, s in track.ttft if now - t <= WINDOW_SECONDS),
            "coupling": coupling,
        }


def _why(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return f"no answer within {FETCH_TIMEOUT_SECONDS:g} s"
    if isinstance(e, ValueError):
        return "not valid JSON"
    return str(e) or type(e).__name__


#: The app's collector, behind `/v1/fleet/status` and `/dashboard`.
FLEET = web.AppKey("fleet", FleetCollector)


async def fleet_ctx(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: one collection before serving, then one per interval until shutdown."""
    collector = app[FLEET]
    await collector.collect()

    async def loop() -> None:
        while True:
            await asyncio.sleep(collector.interval)
            try:
                await collector.collect()
            except Exception:  # one bad round must not end the dashboard
                log.exception("fleet status collection failed")

    task = asyncio.create_task(loop(), name="fleet-status")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
