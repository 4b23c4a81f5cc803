"""The worker's settings, one per `mtpstack worker` flag, and the context limit that follows from them."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtpstack.validator import DEPTH_DEFAULT, PREFIX_CACHE_GIB_DEFAULT

#: Output tokens when a request sets no `max_tokens` (capped by the context left).
DEFAULT_MAX_TOKENS = 512


@dataclass
class WorkerConfig:
    model: str
    draft_model: str | None = None
    draft_depth: int = DEPTH_DEFAULT
    #: `--draft-depth-map`: the depth per workload class; `draft_depth` is the depth of every other class.
    draft_depth_map: dict[str, int] = field(default_factory=dict)
    draft_kind: str = "auto"
    target_bits: str | None = None
    drafter_bits: str | None = None
    max_num_seqs: int = 1
    #: `--max-context-tokens`: caps the model's own context (None: the model's own maximum).
    max_context_tokens: int | None = None
    #: `--prefix-cache-gib`: the prefix cache's budget (0: off).
    prefix_cache_gib: float = PREFIX_CACHE_GIB_DEFAULT
    served_model_name: str = "default"
    host: str = "127.0.0.1"
    port: int = 8000
    admission_grace_seconds: float = 1.0
    stall_seconds: float = 30.0
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    #: `--distributed-backend` (`ring` or `jaccl`): one rank of a worker across hosts; None: one process.
    distributed_backend: str | None = None
    #: `--distributed-strategy`: `tensor` (mlx-lm's `shard`) or `pipeline`.
    distributed_strategy: str = "tensor"

    @property
    def prefix_cache_bytes(self) -> int:
        return int(self.prefix_cache_gib * 2**30)

    @property
    def deepest_draft_depth(self) -> int:
        """The depth of the deepest class: the drafter is loaded at it, and each request drafts at its own."""
        return max([self.draft_depth, *self.draft_depth_map.values()])


def effective_context(model_maximum: int | None, cap: int | None) -> int | None:
    """The context a request may use: the model's own maximum, lowered to `--max-context-tokens` when given."""
    if cap is None:
        return model_maximum
    return cap if model_maximum is None else min(model_maximum, cap)
