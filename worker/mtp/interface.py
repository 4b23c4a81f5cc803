"""What each family's module (`worker/mtp/<module>.py`, named in the family table) exports: its head
class `Head`, of the interface `MTPHead`, and `TARGET`, the hooks its targets' layers need.

The drafter (`mtpstack.worker.drafting`) and the loader (`mtpstack.worker.mtp.load`) use a head only
through `MTPHead`; the engine's rollback (`mtpstack.worker.caches`) and its view of the target
(`mtpstack.worker.loading.TargetParts`) read every family's `TARGET` through the family table, so a
new family is its module and its row, and nothing else names its classes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import mlx.core as mx


class MTPHead(Protocol):
    """An MTP head: drafts from the target's own final hidden state."""

    #: Its own embeddings and output head (GLM's has them), or None: the drafter uses the target's.
    embed: Callable[[mx.array], mx.array] | None
    logits: Callable[[mx.array], mx.array] | None

    @classmethod
    def from_config(cls, text_config: dict) -> MTPHead:
        """The module for a target family's text config (the target's, or the head folder's)."""

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        """One forward over any number of positions: `hidden` is the target's final (post-norm) hidden
        state at the previous position, or the head's own output when it drafts deeper."""

    def make_cache(self) -> list:
        """A cache per layer that keeps one (the drafter keeps a batch KV cache for each)."""

    def sanitize(self, weights: dict[str, mx.array], *, prefix: str, original: bool) -> dict[str, mx.array]:
        """The checkpoint's tensor names (a bundled head's `prefix`, per-expert or fused experts, an
        original checkpoint's norm convention) as the module's own."""


#: A gated-delta layer's input projections: (layer, x) -> (qkv, z, b, a), as mlx-lm's own layer computes them.
Projections = Callable[[object, mx.array], tuple[mx.array, mx.array, mx.array, mx.array]]


@dataclass(frozen=True)
class TargetHooks:
    """What a family's targets need from the engine beyond attention layers with a plain KV cache."""

    #: mlx-lm's gated-delta layer classes, each with its input projections: the engine runs them with
    #: the forward that can set a row's state after fewer positions (`caches.step_state_call`).
    gated_delta: Mapping[type, Projections] = field(default_factory=dict)
    #: mlx-lm's Mamba2 mixer classes, run keeping every position's state (`caches.mamba2_step_state_call`).
    mamba2: frozenset[type] = frozenset()
    #: Which layers keep a cache, when not every one does (Nemotron-H's MLP and MoE blocks keep none).
    keeps_cache: Callable[[object], bool] | None = None
    #: Where the target keeps its body (up to the final norm) and, in it, its embedding table.
    body: str = "model"
    embeddings: str = "embed_tokens"
