"""The Nemotron-H MTP head (`nemotron_h_mtp`): one prediction module of the target's own blocks.

One draft step: `final_norm(blocks(eh_proj(concat(enorm(embed(token)), hnorm(hidden)))))`,
the blocks those of the target's family (mlx-lm's `nemotron_h.NemotronHBlock`, so tensor names and
maths are the target's) in the pattern the config gives (`mtp_hybrid_override_pattern`, attention
`*` and MoE `E` blocks); only the attention blocks keep a cache. The first block carries
`enorm`, `hnorm` and `eh_proj`, the last `final_layernorm`, as mlx-vlm's splitter writes them.
Norms are plain RMSNorms (not zero-centred); MoE experts come stacked (`switch_mlp.fc1/fc2`) or
per expert (`experts.E.up_proj/down_proj`, stacked by `sanitize`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import nemotron_h
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from mtpstack.worker.mtp.experts import stack_experts
from mtpstack.worker.mtp.interface import TargetHooks

#: Per-expert projections -> their names in mlx-lm's `SwitchMLP`.
_STACKED_NAME = {"up_proj": "fc1", "down_proj": "fc2"}
_CHAR = {"attention": "*", "full_attention": "*", "moe": "E", "mlp": "-"}


def _pattern(text_config: dict) -> list[str]:
    pattern = text_config.get("mtp_hybrid_override_pattern")
    if pattern is None and text_config.get("mtp_layers_block_type"):
        pattern = [_CHAR.get(t, "?") for t in text_config["mtp_layers_block_type"]]
    pattern = list(pattern or [])
    if not pattern or any(t not in ("*", "E", "-") for t in pattern):
        raise ValueError(f"the head's block pattern must be attention (`*`) and MLP/MoE blocks: {pattern}")
    return pattern


class NemotronHMTPHead(nn.Module):
    embed = logits = None  # the target's embeddings and LM head

    def __init__(self, args: nemotron_h.ModelArgs, pattern: list[str]):
        super().__init__()
        hidden, eps = args.hidden_size, args.layer_norm_epsilon
        self.layers = [nemotron_h.NemotronHBlock(args, t) for t in pattern]
        first, last = self.layers[0], self.layers[-1]
        first.enorm = nn.RMSNorm(hidden, eps=eps)
        first.hnorm = nn.RMSNorm(hidden, eps=eps)
        first.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        last.final_layernorm = nn.RMSNorm(hidden, eps=eps)

    @classmethod
    def from_config(cls, text_config: dict) -> "NemotronHMTPHead":
        pattern = _pattern(text_config)
        # The target's own block classes, sized by its config; the stack is the head's pattern.
        args = nemotron_h.ModelArgs.from_dict({**text_config, "hybrid_override_pattern": pattern,
                                                "layers_block_type": None, "layer_types": None})
        return cls(args, pattern)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        first = self.layers[0]
        h = first.eh_proj(mx.concatenate([first.enorm(embeddings), first.hnorm(hidden)], axis=-1))
        mask = create_attention_mask(h, cache[0] if cache else None)
        caches = iter(cache)
        for layer in self.layers:
            h = layer(h, mask=mask, cache=next(caches) if layer.block_type == "*" else None)
        return self.layers[-1].final_layernorm(h)

    def make_cache(self) -> list:
        return [KVCache() for layer in self.layers if layer.block_type == "*"]

    @staticmethod
    def sanitize(weights: dict[str, mx.array], *, prefix: str, original: bool) -> dict[str, mx.array]:
        """The module's own names: `prefix` dropped, experts stacked as `switch_mlp.fc1/fc2`."""
        out: dict[str, mx.array] = {}
        for key, value in weights.items():
            key = key.removeprefix(prefix)
            if key.endswith((".k_scale", ".v_scale")):
                continue  # fp8 attention scales some checkpoints carry: nothing here reads them
            out[key] = value
        return stack_experts(out, _STACKED_NAME)


#: The family's head class, as `mtpstack.worker.mtp.families.head_class` finds it.
Head = NemotronHMTPHead


def _keeps_cache(layer) -> bool:
    """The target's Mamba2 (`M`) and attention (`*`) blocks keep a cache; its MLP and MoE blocks none."""
    return getattr(layer, "block_type", None) in ("M", "*")


#: The family's targets, as `mtpstack.worker.mtp.families` finds them: Mamba2 mixers, a cache only in
#: some blocks, and the body mlx-lm calls `backbone` with its `embeddings`.
TARGET = TargetHooks(mamba2=frozenset({nemotron_h.NemotronHMamba2Mixer}), keeps_cache=_keeps_cache,
                     body="backbone", embeddings="embeddings")
