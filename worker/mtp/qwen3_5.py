"""The Qwen3.5-family MTP head (`qwen3_5_mtp`), also used by Qwen3.6/3.8 and Qwen3-Next checkpoints.

One draft step: `norm(layers(fc(concat(norm_e(embed(token)), norm_h(hidden)))))`.
The layers are full-attention decoder layers of the target's own family, built
with mlx-lm's `qwen3_5.DecoderLayer` so their tensor names and maths are the
target's (a MoE block when the text config has experts); each keeps its own KV cache.

Checkpoint layouts read by `sanitize`: mlx-vlm's standalone folders (stacked
`switch_mlp` experts, norms as `1 + w`), and the `mtp.*` tensors of original
checkpoints (norms zero-centred; MoE experts per expert, `experts.E.{gate,up,down}_proj`,
or fused, `experts.gate_up_proj` + `experts.down_proj`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3_5, qwen3_next
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from mtpstack.worker.mtp.experts import stack_experts
from mtpstack.worker.mtp.interface import TargetHooks

#: RMSNorm weights that original (Hugging Face layout) checkpoints store zero-centred:
#: the module computes with `1 + w`, as mlx-lm does for the target's own norms.
ZERO_CENTRED_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)


#: Per-expert projections -> their names in mlx-lm's `SwitchGLU`.
_GLU = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


def _fuse_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Experts as mlx-lm's `SwitchGLU` holds them: `switch_mlp.{gate,up,down}_proj`, experts stacked first."""
    out: dict[str, mx.array] = {}
    for key, value in weights.items():
        if key.endswith(".experts.gate_up_proj"):
            mlp = key.removesuffix(".experts.gate_up_proj")
            gate, up = mx.split(value, 2, axis=-2)  # [experts, 2 * moe_intermediate, hidden]
            out[f"{mlp}.switch_mlp.gate_proj.weight"], out[f"{mlp}.switch_mlp.up_proj.weight"] = gate, up
        elif key.endswith(".experts.down_proj"):
            out[f"{key.removesuffix('.experts.down_proj')}.switch_mlp.down_proj.weight"] = value
        else:
            out[key] = value
    return stack_experts(out, _GLU)


class Qwen35MTPHead(nn.Module):
    embed = logits = None  # the target's embeddings and LM head

    def __init__(self, args: qwen3_5.TextModelArgs, num_layers: int):
        super().__init__()
        hidden = args.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.layers = [qwen3_5.DecoderLayer(args, layer_idx=0) for _ in range(num_layers)]
        self.norm = nn.RMSNorm(hidden, eps=args.rms_norm_eps)

    @classmethod
    def from_config(cls, text_config: dict) -> "Qwen35MTPHead":
        # Every head layer is a full-attention layer: interval 1 makes layer 0 one.
        text_config = dict(text_config)
        if "rope_parameters" not in text_config and "rope_theta" in text_config:
            # A Qwen3-Next config (a bundled head, or a folder not written by mlx-vlm's splitter) keeps
            # its rotary settings at the top; Qwen3.5's layers read them from `rope_parameters`.
            text_config["rope_parameters"] = {"type": "default", "rope_theta": text_config["rope_theta"],
                                              "partial_rotary_factor": text_config.get("partial_rotary_factor", 1.0)}
        args = qwen3_5.TextModelArgs.from_dict({**text_config, "full_attention_interval": 1})
        return cls(args, int(text_config.get("mtp_num_hidden_layers", 1)))

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        h = mx.concatenate([self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden)], axis=-1)
        h = self.fc(h)
        mask = create_attention_mask(h, cache[0])
        for layer, layer_cache in zip(self.layers, cache):
            h = layer(h, mask=mask, cache=layer_cache)
        return self.norm(h)

    def make_cache(self) -> list:
        return [KVCache() for _ in self.layers]

    @staticmethod
    def sanitize(weights: dict[str, mx.array], *, prefix: str, original: bool) -> dict[str, mx.array]:
        """The module's own names: `prefix` dropped, an original checkpoint's zero-centred norms as
        `1 + w`, MoE experts stacked (`_fuse_experts`)."""
        out = {}
        for key, value in weights.items():
            had_prefix = key.startswith(prefix)
            key = key.removeprefix(prefix)
            if original and had_prefix and value.ndim == 1 and key.endswith(ZERO_CENTRED_NORMS):
                value = value + 1.0
            out[key] = value
        return _fuse_experts(out)


#: The family's head class, as `mtpstack.worker.mtp.families.head_class` finds it.
Head = Qwen35MTPHead


# -- the targets' gated-delta layers, run by the engine with the state after every position ----------


def _qwen3_5_projections(layer, x: mx.array):
    b_, s_, _ = x.shape
    qkv = layer.in_proj_qkv(x)
    z = layer.in_proj_z(x).reshape(b_, s_, layer.num_v_heads, layer.head_v_dim)
    return qkv, z, layer.in_proj_b(x), layer.in_proj_a(x)


def _qwen3_next_projections(layer, x: mx.array):
    b_, s_, _ = x.shape
    q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x), layer.in_proj_ba(x))
    qkv = mx.concatenate([q.reshape(b_, s_, -1), k.reshape(b_, s_, -1), v.reshape(b_, s_, -1)], axis=-1)
    return qkv, z, b, a


#: The family's targets, as `mtpstack.worker.mtp.families` finds them: Qwen3.5's and Qwen3-Next's
#: gated-delta layers, each with its own input projections.
TARGET = TargetHooks(gated_delta={
    qwen3_5.GatedDeltaNet: _qwen3_5_projections,
    qwen3_next.Qwen3NextGatedDeltaNet: _qwen3_next_projections,
})
