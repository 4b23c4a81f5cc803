"""The worker's Prometheus metrics: the `/metrics` series documented in docs/worker.md, named in
`mtpstack.series` (the one list the proxy and the bench read them back by), one registry per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mtpstack import series


class Metrics:
    """Every series the worker exports: the generation thread and the handlers count, `/metrics` renders."""

    def __init__(self, max_depth: int):
        self.registry = CollectorRegistry()
        self._drafting_series(self.registry, max_depth)
        self._prefill_series(self.registry)
        self._cache_series(self.registry)
        self._depth_series(self.registry)
        for position in range(1, max_depth + 1):
            self.by_position.labels(position=str(position))
            self.drafted_by_position.labels(position=str(position))
        self.rejected.labels(code="worker_full")

    def _drafting_series(self, r: CollectorRegistry, max_depth: int) -> None:
        """Tokens, drafts and acceptance, requests and refusals, the drafter and the decode steps."""
        self.generated = Counter(series.TOKENS_GENERATED, "Tokens emitted to clients.", registry=r)
        self.drafted = Counter(series.TOKENS_DRAFTED, "Tokens proposed by the drafter.", registry=r)
        self.accepted = Counter(series.TOKENS_ACCEPTED, "Drafted tokens the target confirmed.", registry=r)
        self.by_position = Counter(
            series.ACCEPTED_BY_POSITION,
            "Drafted tokens accepted, by position in the draft (1 = first).",
            ["position"],
            registry=r,
        )
        self.drafted_by_position = Counter(
            series.DRAFTED_BY_POSITION,
            "Tokens drafted, by position in the draft (1 = first): acceptance at a position is accepted over drafted there.",
            ["position"],
            registry=r,
        )
        self.per_step = Histogram(
            series.ACCEPTED_PER_STEP,
            "Drafted tokens accepted per draft-and-verify step.",
            buckets=[float(i) for i in range(max(max_depth, 1) + 1)],
            registry=r,
        )
        self.active = Gauge(series.ACTIVE_SEQUENCES, "Sequences admitted and not finished.", registry=r)
        self.rejected = Counter(series.REJECTED, "Requests refused, by error code.", ["code"], registry=r)
        self.drafter = Gauge(
            series.DRAFTER_INFO,
            "The loaded drafter: kind mtp (an MTP head) or model (a separate draft model), 1 while loaded.",
            ["kind", "bundled", "depth"],
            registry=r,
        )
        self.target_steps = Counter(
            series.TARGET_STEPS,
            "Target decode steps: one batched forward that drafts and verifies every decoding row, at any width.",
            registry=r,
        )
        self.target_step_seconds = Counter(
            series.TARGET_STEP_SECONDS,
            "Seconds the generation thread spent in target decode steps (the step alone, not the server around it).",
            registry=r,
        )
        self.requests_by_class = Counter(
            series.REQUESTS_BY_CLASS, "Requests admitted, by workload class.", ["class"], registry=r
        )
        self.drafted_by_class = Counter(
            series.TOKENS_DRAFTED_BY_CLASS, "Tokens proposed by the drafter, by workload class.", ["class"], registry=r
        )
        self.accepted_by_class = Counter(
            series.TOKENS_ACCEPTED_BY_CLASS, "Drafted tokens the target confirmed, by workload class.", ["class"], registry=r
        )

    def _prefill_series(self, r: CollectorRegistry) -> None:
        """The prefill and what it does to decoding rows (`mtpstack.worker.pacing`)."""
        self.prefilled = Counter(series.PREFILL_TOKENS, "Prompt tokens run through the target's prefill "
                                 "(not those resumed from the prefix cache or another row's prefill).", registry=r)
        self.prefill_seconds = Counter(series.PREFILL_SECONDS, "Seconds the generation thread spent in prefill forwards.",
                                       registry=r)
        self.prefill_rate = Gauge(series.PREFILL_TOKENS_PER_SECOND,
                                  "Prompt tokens per second of prefill forwards over the last minute.", registry=r)
        self.longest_gap = Gauge(series.DECODE_LONGEST_GAP, "The longest wait between two steps that gave decoding "
                                 "rows tokens, over the last minute.", registry=r)

    def _cache_series(self, r: CollectorRegistry) -> None:
        """The prefix cache and its disk tier."""
        self.cache_lookups = Counter(series.PREFIX_CACHE_LOOKUPS, "Prompts looked up in the prefix cache.", registry=r)
        self.cache_hits = Counter(series.PREFIX_CACHE_HITS, "Prompts that resumed from a prefix-cache snapshot.", registry=r)
        self.cache_tokens = Counter(series.PREFIX_CACHE_TOKENS_REUSED,
                                    "Prompt tokens taken from the prefix cache instead of prefilled.", registry=r)
        self.cache_evictions = Counter(series.PREFIX_CACHE_EVICTIONS,
                                       "Snapshots dropped to keep the prefix cache within its budget.", registry=r)
        self.cache_bytes = Gauge(series.PREFIX_CACHE_BYTES, "Bytes the prefix cache holds.", registry=r)
        self._cache_seen = (0, 0, 0, 0)
        self.disk = [
            Counter(series.PREFIX_CACHE_DISK_HITS, "Prompts resumed from a snapshot read from the prefix cache's disk tier.", registry=r),
            Counter(series.PREFIX_CACHE_DISK_WRITES, "Snapshot stretches written to the disk tier.", registry=r),
            Counter(series.PREFIX_CACHE_DISK_EVICTIONS,
                    "Snapshots (and other models' files) removed from the disk tier to keep it within its budget.", registry=r),
            Counter(series.PREFIX_CACHE_DISK_ERRORS, "Bad files found (each a miss, removed) and failed writes on the disk tier.",
                    registry=r),
            Counter(series.PREFIX_CACHE_DISK_READ_BYTES, "Bytes of snapshots read back from the disk tier.", registry=r),
            Counter(series.PREFIX_CACHE_DISK_WRITE_SECONDS, "Seconds the disk tier's thread spent writing files, syncs included.",
                    registry=r),
            Counter(series.PREFIX_CACHE_DISK_SYNC_SECONDS, "Seconds of those writes spent syncing the files and their folder.",
                    registry=r),
        ]
        self.disk_bytes = Gauge(series.PREFIX_CACHE_DISK_BYTES,
                                "Bytes in the disk tier's directory its budget counts (other models' included).", registry=r)
        self.disk_restore = Histogram(series.PREFIX_CACHE_DISK_RESTORE_SECONDS,
                                      "Seconds from a lookup to a row's caches restored from the disk tier.",
                                      buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self._disk_seen = (0,) * len(self.disk)

    def _depth_series(self, r: CollectorRegistry) -> None:
        """The draft depth each step and row runs, and what the adaptive depth chose it from."""
        self.depth = Gauge(series.DRAFT_DEPTH, "The draft depth of the last decode step.", registry=r)
        self.depth_by_row = Gauge(series.DRAFT_DEPTH_BY_ROW, "Tokens each decoding row drafted in the last decode step.",
                                  ["row"], registry=r)
        self.depth_steps = Counter(series.DRAFT_DEPTH_STEPS, "Decode steps, by their draft depth.", ["depth"], registry=r)
        self.acceptance_estimate = Gauge(series.DRAFT_ACCEPTANCE_ESTIMATE, "The adaptive depth's estimate of acceptance "
                                         "at each draft position, given the ones before it were accepted.", ["position"], registry=r)
        self.verify_seconds = Gauge(series.VERIFY_STEP_SECONDS, "The adaptive depth's measured seconds of a verify step at "
                                    "each depth, at the last step's batch width.", ["depth"], registry=r)
        self._rows_shown = 0

    def drafter_info(self, engine) -> None:
        if engine.drafter is not None:
            self.drafter.labels(kind=engine.draft_kind, bundled=str(engine.drafter.bundled).lower(),
                                depth=str(engine.draft_depth)).set(1)

    def prefix_cache(self, stats, disk=None) -> None:
        """Bring the prefix-cache series up to the cache's own counts (the generation thread keeps
        those), and its disk tier's (`disk`: a `prefix_disk.DiskTier`, whose thread counts too)."""
        now = (stats.lookups, stats.hits, stats.tokens_reused, stats.evictions)
        for counter, new, old in zip((self.cache_lookups, self.cache_hits, self.cache_tokens, self.cache_evictions), now, self._cache_seen):
            if new > old:
                counter.inc(new - old)
        self._cache_seen = now
        self.cache_bytes.set(stats.bytes)
        if disk is not None:
            d = disk.stats
            now = (d.hits, d.writes, d.evictions, d.errors, d.read_bytes, d.write_seconds, d.sync_seconds)
            for counter, new, old in zip(self.disk, now, self._disk_seen):
                if new > old:
                    counter.inc(new - old)
            self._disk_seen = now
            self.disk_bytes.set(disk.total_bytes)
            for seconds in disk.drain_restores():
                self.disk_restore.observe(seconds)

    def draft_depth(self, batch, steps: int, policy) -> None:
        """After a step that ran `steps` decode forwards (0 or 1): its depth and each row's, and the policy's view."""
        if steps and batch is not None:
            self.depth.set(batch.last_depth)
            self.depth_steps.labels(depth=str(batch.last_depth)).inc(steps)
            for row, k in enumerate(batch.last_plans):
                self.depth_by_row.labels(row=str(row)).set(k)
            for row in range(len(batch.last_plans), self._rows_shown):
                self.depth_by_row.remove(str(row))
            self._rows_shown = len(batch.last_plans)
        if policy is not None:
            view = policy.describe()
            for position, rate in enumerate(view["acceptance"], start=1):
                self.acceptance_estimate.labels(position=str(position)).set(rate)
            for depth, seconds in view["cost"].items():
                self.verify_seconds.labels(depth=str(depth)).set(seconds)

    def pacing(self, pacer, prefill_seconds: float) -> None:
        """After a step: the prefill's time in it and the last minute's figures (`mtpstack.worker.pacing`)."""
        if prefill_seconds:
            self.prefill_seconds.inc(prefill_seconds)
        self.prefill_rate.set(pacer.prefill_rate())
        self.longest_gap.set(pacer.longest_gap())

    def record_step(self, drafted: int, accepted: int, tokens: int, cls: str | None = None, prefill: int = 0) -> None:
        if prefill:
            self.prefilled.inc(prefill)
        if drafted and cls is not None:
            self.drafted_by_class.labels(cls).inc(drafted)
            self.accepted_by_class.labels(cls).inc(accepted)
        if tokens:
            self.generated.inc(tokens)
        if drafted:
            self.drafted.inc(drafted)
            self.accepted.inc(accepted)
            self.per_step.observe(accepted)
            for position in range(1, drafted + 1):
                self.drafted_by_position.labels(position=str(position)).inc()
            for position in range(1, accepted + 1):
                self.by_position.labels(position=str(position)).inc()

