"""The worker's Prometheus series, by the sample names `/metrics` shows: one owner for the names
the worker registers (`mtpstack.worker.metrics`) and everything that reads them back (the proxy's
fleet view, `mtpstack bench`, the benchmark scripts).

Counters carry their `_total` suffix here, as they appear in the text; `prometheus_client` strips it
from the family name when the worker registers them, so the exposition is unchanged.
"""

from __future__ import annotations

TOKENS_GENERATED = "mtpstack_worker_tokens_generated_total"
TOKENS_DRAFTED = "mtpstack_worker_tokens_drafted_total"
TOKENS_ACCEPTED = "mtpstack_worker_tokens_accepted_total"
#: Labelled by `position` (1 = the first drafted token of a round).
ACCEPTED_BY_POSITION = "mtpstack_worker_accepted_by_position_total"
DRAFTED_BY_POSITION = "mtpstack_worker_drafted_by_position_total"
ACCEPTED_PER_STEP = "mtpstack_worker_accepted_per_step"
ACTIVE_SEQUENCES = "mtpstack_worker_active_sequences"
#: Labelled by `code`.
REJECTED = "mtpstack_worker_rejected_total"
#: 1, labelled by `kind` and `depth` of the loaded drafter.
DRAFTER_INFO = "mtpstack_worker_drafter_info"
TARGET_STEPS = "mtpstack_worker_target_steps_total"
#: Seconds the generation thread spent in those steps: over `TARGET_STEPS`, a step's own time, apart from
#: the server around it (admission, streaming, the HTTP side).
TARGET_STEP_SECONDS = "mtpstack_worker_target_step_seconds_total"
#: Labelled by `class`.
REQUESTS_BY_CLASS = "mtpstack_worker_requests_by_class_total"
TOKENS_DRAFTED_BY_CLASS = "mtpstack_worker_tokens_drafted_by_class_total"
TOKENS_ACCEPTED_BY_CLASS = "mtpstack_worker_tokens_accepted_by_class_total"
#: Prompt tokens run through the target's prefill (those taken from the prefix cache or from another
#: row's prefill are not).
PREFILL_TOKENS = "mtpstack_worker_prefill_tokens_total"
#: Seconds the generation thread spent in prefill forwards: `rate(PREFILL_TOKENS) / rate(PREFILL_SECONDS)`
#: is the prefill's own speed.
PREFILL_SECONDS = "mtpstack_worker_prefill_seconds_total"
#: Over the last minute: prompt tokens per second of prefill forwards, and the longest wait between two
#: steps that gave decoding rows tokens (what a neighbour's prefill costs a stream).
PREFILL_TOKENS_PER_SECOND = "mtpstack_worker_prefill_tokens_per_second"
DECODE_LONGEST_GAP = "mtpstack_worker_decode_longest_gap_seconds"
#: The draft depth (`--draft-depth auto`: the policy's pick, `mtpstack.worker.depth_policy`): the last
#: decode step's depth, each decoding row's drafted tokens in it (labelled `row`, 0 to the width - 1),
#: decode steps by `depth`, and what the policy chose from: its acceptance estimate per `position` and
#: a verify step's measured seconds per `depth` at the last step's width.
DRAFT_DEPTH = "mtpstack_worker_draft_depth"
DRAFT_DEPTH_BY_ROW = "mtpstack_worker_draft_depth_by_row"
DRAFT_DEPTH_STEPS = "mtpstack_worker_draft_depth_steps_total"
DRAFT_ACCEPTANCE_ESTIMATE = "mtpstack_worker_draft_acceptance_estimate"
VERIFY_STEP_SECONDS = "mtpstack_worker_verify_step_seconds"
PREFIX_CACHE_LOOKUPS = "mtpstack_worker_prefix_cache_lookups_total"
PREFIX_CACHE_HITS = "mtpstack_worker_prefix_cache_hits_total"
PREFIX_CACHE_TOKENS_REUSED = "mtpstack_worker_prefix_cache_tokens_reused_total"
PREFIX_CACHE_EVICTIONS = "mtpstack_worker_prefix_cache_evictions_total"
PREFIX_CACHE_BYTES = "mtpstack_worker_prefix_cache_bytes"
#: The prefix cache's disk tier (`--prefix-cache-dir`): prompts resumed from disk, nodes written,
#: snapshots removed for its budget (and other models' files), bad files and failed writes, its bytes
#: (other models' included, as its budget counts them), and a histogram of a restore's seconds
#: (from the lookup to the row's caches in place); the seconds its thread spent writing files and,
#: of those, syncing them (their fsyncs, which make a write survive a power cut).
PREFIX_CACHE_DISK_HITS = "mtpstack_worker_prefix_cache_disk_hits_total"
PREFIX_CACHE_DISK_WRITES = "mtpstack_worker_prefix_cache_disk_writes_total"
PREFIX_CACHE_DISK_EVICTIONS = "mtpstack_worker_prefix_cache_disk_evictions_total"
PREFIX_CACHE_DISK_ERRORS = "mtpstack_worker_prefix_cache_disk_errors_total"
PREFIX_CACHE_DISK_BYTES = "mtpstack_worker_prefix_cache_disk_bytes"
PREFIX_CACHE_DISK_READ_BYTES = "mtpstack_worker_prefix_cache_disk_read_bytes_total"
PREFIX_CACHE_DISK_RESTORE_SECONDS = "mtpstack_worker_prefix_cache_disk_restore_seconds"
PREFIX_CACHE_DISK_WRITE_SECONDS = "mtpstack_worker_prefix_cache_disk_write_seconds_total"
PREFIX_CACHE_DISK_SYNC_SECONDS = "mtpstack_worker_prefix_cache_disk_sync_seconds_total"
