"""The worker's settings, one per `mtpstack worker` flag, and the context limit that follows from them.

The flags, their defaults and their ranges are declared once, in the settings table
(`mtpstack.validator.WORKER_SETTINGS`); `WorkerConfig` has one field per row (but `--log-level`,
which only configures logging) and takes its defaults from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtpstack.validator import SETTINGS, effective_context

__all__ = ["WorkerConfig", "effective_context"]


def _default(name: str):
    return SETTINGS[name].default


@dataclass
class WorkerConfig:
    model: str
    draft_model: str | None = None
    draft_depth: int | str = _default("draft_depth")
    #: `--draft-depth-map`: the depth per workload class; `draft_depth` is the depth of every other class.
    draft_depth_map: dict[str, int | str] = field(default_factory=dict)
    draft_max_depth: int = 4
    draft_kind: str = _default("draft_kind")
    target_bits: str | None = None
    drafter_bits: str | None = None
    max_num_seqs: int = _default("max_num_seqs")
    #: `--max-context-tokens`: caps the model's own context (None: the model's own maximum).
    max_context_tokens: int | None = None
    #: `--prefix-cache-gib`: the prefix cache's budget (0: off).
    prefix_cache_gib: float = _default("prefix_cache_gib")
    #: `--prefix-cache-dir`: the directory of the prefix cache's disk tier (None: no disk tier).
    prefix_cache_dir: str | None = None
    #: `--prefix-cache-disk-gib`: the disk tier's budget (0: off).
    prefix_cache_disk_gib: float = _default("prefix_cache_disk_gib")
    served_model_name: str = "default"
    host: str = _default("host")
    port: int = _default("port")
    admission_grace_seconds: float = _default("admission_grace_seconds")
    stall_seconds: float = _default("stall_seconds")
    #: Output tokens when a request sets no `max_tokens` (capped by the context left).
    default_max_tokens: int = _default("default_max_tokens")
    #: `--distributed-backend` (`ring` or `jaccl`): one rank of a worker across hosts; None: one process.
    distributed_backend: str | None = None
    #: `--distributed-strategy`: `tensor` (mlx-lm's `shard`) or `pipeline`.
    distributed_strategy: str = _default("distributed_strategy")

    @property
    def prefix_cache_bytes(self) -> int:
        return int(self.prefix_cache_gib * 2**30)

    @property
    def prefix_cache_disk_bytes(self) -> int:
        return int(self.prefix_cache_disk_gib * 2**30)

    @property
    def deepest_draft_depth(self) -> int:
        """The depth of the deepest class: the drafter is loaded at it, and each request drafts at its own."""
        depths = [self.draft_depth, *self.draft_depth_map.values()]
        return max(self.draft_max_depth if d == "auto" else d for d in depths)

    def depth_for(self, cls: str) -> int | str:
        return self.draft_depth_map.get(cls, self.draft_depth)
