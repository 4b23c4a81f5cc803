"""Tenants: who a request's key belongs to, what each may use, and what each used.

A key is looked up by its keyed digest (HMAC-SHA256 under a secret drawn at start): one digest per
request and one dict lookup, whatever the number of keys, and the lookup compares digests no client
can choose, so a wrong key costs the same as a right one. Limits are sliding one-minute windows of
one-second buckets (constant memory per tenant); a refusal says when the window lets the request in.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

from mtpstack.proxy.admission import Rejected
from mtpstack.proxy.auth import load_api_keys
from mtpstack.validator import DEFAULT_TENANT, FleetConfig, TenantConfig

#: The limits' window and its resolution.
WINDOW_SECONDS = 60
_UNLIMITED = TenantConfig()
#: Tenants shown in `/v1/fleet/status` (those with the most requests).
TENANTS_SHOWN = 100


class Window:
    """Counts over the last `WINDOW_SECONDS` whole seconds, in one bucket per second."""

    __slots__ = ("buckets", "stamps")

    def __init__(self) -> None:
        self.buckets = [0] * WINDOW_SECONDS
        self.stamps = [-1] * WINDOW_SECONDS

    def add(self, now: float, n: int) -> None:
        second = int(now)
        i = second % WINDOW_SECONDS
        if self.stamps[i] != second:
            self.stamps[i], self.buckets[i] = second, 0
        self.buckets[i] += n

    def total(self, now: float) -> int:
        oldest = int(now) - WINDOW_SECONDS + 1
        return sum(b for b, s in zip(self.buckets, self.stamps) if s >= oldest)

    def retry_after(self, now: float, limit: int) -> int:
        """Whole seconds until the window holds fewer than `limit`, its oldest buckets aging out."""
        oldest = int(now) - WINDOW_SECONDS + 1
        live = sorted((s, b) for b, s in zip(self.buckets, self.stamps) if s >= oldest)
        total = sum(b for _, b in live)
        wait = 0.0
        for s, b in live:
            if total < limit:
                break
            total -= b
            wait = s + WINDOW_SECONDS - now  # bucket `s` leaves the window at s + WINDOW_SECONDS
        return max(1, math.ceil(wait))


@dataclass(eq=False, slots=True)
class Tenant:
    name: str
    settings: TenantConfig = _UNLIMITED
    #: Requests that passed its limits and are not finished (waiting or admitted).
    inflight: int = 0
    #: The limits' windows, made when a limit is first checked (a tenant without limits has none).
    requests: Window | None = None
    tokens: Window | None = None
    #: Usage since start, for `/v1/fleet/status`: requests by status, tokens, queue seconds.
    by_status: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue_seconds: float = 0.0

    @property
    def weight(self) -> int:
        return self.settings.weight

    def admit(self, now: float, retry_after: Callable[[], int]) -> None:
        """Count a new request against the limits, or raise `Rejected` 429 naming the limit (and this
        tenant, to this tenant alone). `retry_after`: the model's estimate, for the concurrency limit."""
        s = self.settings
        if s.max_concurrent is not None and self.inflight >= s.max_concurrent:
            raise self._refuse("tenant_max_concurrent", f"{s.max_concurrent} requests in flight at once (`maxConcurrent`)", retry_after())
        if s.requests_per_minute is not None:
            self.requests = self.requests or Window()
            if self.requests.total(now) >= s.requests_per_minute:
                raise self._refuse("tenant_requests_per_minute", f"{s.requests_per_minute} requests per minute (`requestsPerMinute`)",
                                   self.requests.retry_after(now, s.requests_per_minute))
        if s.tokens_per_minute is not None:
            self.tokens = self.tokens or Window()
            if self.tokens.total(now) >= s.tokens_per_minute:
                raise self._refuse("tenant_tokens_per_minute", f"{s.tokens_per_minute} tokens per minute (`tokensPerMinute`)",
                                   self.tokens.retry_after(now, s.tokens_per_minute))
        if self.requests is not None:
            self.requests.add(now, 1)
        self.inflight += 1

    def _refuse(self, code: str, limit: str, retry_after: int) -> Rejected:
        return Rejected(HTTPStatus.TOO_MANY_REQUESTS, code,
                        f"tenant `{self.name}` is over its limit of {limit}; retry in {retry_after} s", retry_after)

    def charge(self, now: float, prompt: int, cached: int, completion: int) -> None:
        """Tokens a request used: the prompt's not read from a cache and the completion count
        against `tokensPerMinute`."""
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.completion_tokens += completion
        if self.settings.tokens_per_minute is not None:
            self.tokens = self.tokens or Window()
            self.tokens.add(now, max(0, prompt - cached) + completion)

    def finished(self, status: int, queue_seconds: float | None) -> None:
        key = str(status)
        self.by_status[key] = self.by_status.get(key, 0) + 1
        if queue_seconds is not None:
            self.queue_seconds += queue_seconds

    def usage(self) -> dict:
        return {"requests": dict(self.by_status), "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens, "queue_seconds": round(self.queue_seconds, 3),
                "inflight": self.inflight}


class Tenants:
    """The keys and the tenants' settings in effect; `prepare` then `install` swaps them whole (SIGHUP)."""

    def __init__(self, config: FleetConfig) -> None:
        """The keys of `config`'s keys file (read now: `ApiKeysError` when it cannot be used) and its tenants."""
        self._secret = os.urandom(32)
        #: Every tenant ever named by name (its usage outlives a reload that drops its key).
        self.all: dict[str, Tenant] = {}
        #: Those that sent a request, in order of their first: what the fleet status shows.
        self.active: dict[str, Tenant] = {}
        #: A keys file is set: a request needs a key; else every request is `default`'s.
        self.keyed = False
        self.keys = 0
        self._digests: dict[bytes, Tenant] = {}
        self.default = self._tenant(DEFAULT_TENANT)
        self.install(config, self.prepare(config))

    def _tenant(self, name: str) -> Tenant:
        t = self.all.get(name)
        if t is None:
            t = self.all[name] = Tenant(name)
        return t

    def _digest(self, key: bytes) -> bytes:
        return hmac.new(self._secret, key, hashlib.sha256).digest()

    def prepare(self, config: FleetConfig) -> dict[bytes, str] | None:
        """The keys file of `config` read and digested, key digest -> tenant name (None: no keys file).
        Touches nothing in effect, so a reload runs it off the event loop (100,000 keys take seconds).
        Raises `ApiKeysError` when the file cannot be used."""
        path = config.proxy.api_keys_file
        return None if not path else {self._digest(line.key): line.tenant for line in load_api_keys(path)}

    def install(self, config: FleetConfig, digests: dict[bytes, str] | None) -> None:
        """Take `prepare`'s keys and `config`'s tenants at once. A request in flight keeps the
        `Tenant` it got; a tenant's usage outlives a reload that drops its key."""
        settings = config.proxy.tenants
        self._digests = {digest: self._tenant(name) for digest, name in (digests or {}).items()}
        for name, t in self.all.items():
            t.settings = settings.get(name, _UNLIMITED)
        self.keyed = digests is not None
        self.keys = len(self._digests)

    def lookup(self, presented: bytes | None) -> Tenant | None:
        """The tenant of a presented key; without a keys file every request is `default`'s."""
        if not self.keyed:
            return self.default
        if presented is None:
            return None
        return self._digests.get(self._digest(presented))

    def finished(self, tenant: Tenant, status: int, queue_seconds: float | None) -> None:
        tenant.finished(status, queue_seconds)
        self.active.setdefault(tenant.name, tenant)

    def snapshot(self, most: int = TENANTS_SHOWN) -> tuple[dict, int]:
        """The usage of the `most` tenants with the most requests (by name among equals), and how many
        more sent requests: a fleet of 100,000 keys does not make a status document of 100,000 rows."""
        ranked = sorted(self.active.values(), key=lambda t: (-sum(t.by_status.values()), t.name))
        return {t.name: t.usage() for t in ranked[:most]}, max(0, len(ranked) - most)
