"""The GLM-4.7-Flash MTP head (`glm4_moe_lite_mtp`): one next-token-prediction layer of the target's family.

One draft step: `block(eh_proj(concat(enorm(embed(token)), hnorm(hidden))))`, proposing with
`lm_head(shared_head_norm(...))`. Unlike the Qwen and Nemotron heads it has its own embeddings and
output head (`model.embed_tokens`, `lm_head`). The block is mlx-lm's `glm4_moe_lite` decoder layer
(MLA attention with the absorbed `embed_q` / `unembed_out` projections, a MoE block), so names and
maths are the target's. Names are those mlx-vlm's splitter writes (`model.{embed_tokens, enorm,
hnorm, eh_proj, mtp_block.*, shared_head_norm}`, `lm_head`); an original checkpoint keeps the layer
as `model.layers.<num_hidden_layers>.*` with `shared_head.{norm,head}`, a fused `kv_b_proj` and
per-expert tensors, all mapped here. Norms are plain RMSNorms.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import glm4_moe_lite
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from mtpstack.worker.mtp.experts import stack_experts
from mtpstack.worker.mtp.interface import TargetHooks

#: Per-expert projections -> their names in mlx-lm's `SwitchGLU`.
_GLU = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}
#: An original checkpoint's names (after its `model.layers.<N>.` prefix) -> the splitter's flat ones.
_FLAT = {"embed_tokens.weight": "model.embed_tokens.weight", "enorm.weight": "model.enorm.weight",
         "hnorm.weight": "model.hnorm.weight", "eh_proj.weight": "model.eh_proj.weight",
         "shared_head.norm.weight": "model.shared_head_norm.weight", "shared_head.head.weight": "lm_head.weight"}


class _Inner(nn.Module):
    def __init__(self, args: glm4_moe_lite.ModelArgs):
        super().__init__()
        hidden, eps = args.hidden_size, args.rms_norm_eps
        self.embed_tokens = nn.Embedding(args.vocab_size, hidden)
        self.enorm = nn.RMSNorm(hidden, eps=eps)
        self.hnorm = nn.RMSNorm(hidden, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        # The layer after the target's last: a MoE layer whenever the target's later layers are.
        self.mtp_block = glm4_moe_lite.Glm4MoeLiteDecoderLayer(args, layer_idx=args.num_hidden_layers)
        self.shared_head_norm = nn.RMSNorm(hidden, eps=eps)


class Glm4MoeLiteMTPHead(nn.Module):
    def __init__(self, args: glm4_moe_lite.ModelArgs):
        super().__init__()
        self.model = _Inner(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.heads, self.nope, self.v_dim = args.num_attention_heads, args.qk_nope_head_dim, args.v_head_dim

    @classmethod
    def from_config(cls, text_config: dict) -> "Glm4MoeLiteMTPHead":
        return cls(glm4_moe_lite.ModelArgs.from_dict(text_config))

    # -- its own embeddings and output head (the drafter uses them instead of the target's) --

    def embed(self, tokens: mx.array) -> mx.array:
        return self.model.embed_tokens(tokens)

    def logits(self, hidden: mx.array) -> mx.array:
        return self.lm_head(self.model.shared_head_norm(hidden))

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        m = self.model
        h = m.eh_proj(mx.concatenate([m.enorm(embeddings), m.hnorm(hidden)], axis=-1))
        mask = create_attention_mask(h, cache[0], return_array=True)
        return m.mtp_block(h, mask, cache=cache[0])

    def make_cache(self) -> list:
        return [KVCache()]

    def sanitize(self, weights: dict[str, mx.array], *, prefix: str, original: bool) -> dict[str, mx.array]:
        """The module's own names from either layout: flat names, `kv_b_proj` split, experts stacked."""
        out: dict[str, mx.array] = {}
        for key, value in weights.items():
            if key.endswith("rotary_emb.inv_freq"):
                continue  # a buffer, recomputed
            if key.startswith(prefix) and prefix.startswith("model.layers."):
                rest = key.removeprefix(prefix)
                key = _FLAT.get(rest, f"model.mtp_block.{rest}")
            out[key] = value
        out = stack_experts(out, _GLU)
        fused = out.pop("model.mtp_block.self_attn.kv_b_proj.weight", None)
        if fused is not None:
            per_head = fused.reshape(self.heads, self.nope + self.v_dim, -1)
            out["model.mtp_block.self_attn.embed_q.weight"] = mx.contiguous(per_head[:, : self.nope, :].swapaxes(-1, -2))
            out["model.mtp_block.self_attn.unembed_out.weight"] = mx.contiguous(per_head[:, self.nope :, :])
        return out


#: The family's head class, as `mtpstack.worker.mtp.families.head_class` finds it.
Head = Glm4MoeLiteMTPHead

#: The family's targets keep attention layers only: nothing beyond a plain KV cache.
TARGET = TargetHooks()
