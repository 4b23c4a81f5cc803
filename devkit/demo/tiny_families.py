"""Tiny random MTP pairs of the other families and layouts real checkpoints use, for tests and benches.

`devkit.demo.tiny_hybrid` builds the dense Qwen3.5 pair; this module builds, the same way (mlx-lm's
own target classes, heads that agree with their target about half the time):

- the Qwen3.5 MoE pair (`qwen3_5_moe`: 4 experts, 2 per token, a shared expert), whose head is
  written in each layout users download: mlx-vlm's standalone folder (`standalone`), the same
  quantized to 6 bits with the 8-bit router gates mlx-lm/mlx-vlm record per module in
  `quantization` (`quantized`), and bundled as `mtp.*` in an original checkpoint with per-expert
  tensors (`bundled-per-expert`) or fused `gate_up_proj` experts (`bundled-fused`);
- the Qwen3-Next pair (`qwen3_next`: gated-delta + attention, MoE), whose head is a `qwen3_5_mtp`
  folder as mlx-vlm's qwen3_next splitter writes it;
- the Nemotron-H pair (`nemotron_h`: Mamba2 + attention + MoE blocks), whose `nemotron_h_mtp` head
  (an attention and a MoE block) is standalone as mlx-vlm's splitter writes it, or bundled as `mtp.*`
  with per-expert tensors;
- the GLM-4.7-Flash pair (`glm4_moe_lite`: MLA attention + MoE), whose `glm4_moe_lite_mtp` head has
  its own embeddings and output head, standalone in the splitter's flat layout or bundled as
  `model.layers.<N>.*` with a fused `kv_b_proj` and per-expert tensors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from devkit.demo import TOKENIZER_DIR
from devkit.demo.bpe import TOKENIZER_FILES
from devkit.demo.modeldir import head_config, qwen3_5_config, qwen3_5_text_config, save_head_dir, save_model_dir
from devkit.demo.tiny_hybrid import (
    EMBEDDING_GAIN,
    HEAD_EMBEDDING_GAIN,
    HEAD_HIDDEN_GAIN,
    HEAD_LAYER_GAIN,
    TINY_HYBRID,
    build_tiny_hybrid_pair,
    to_original_layout,
)

#: Experts small enough to build in milliseconds, sized so every projection quantizes at group size 64.
TINY_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                decoder_sparse_step=1, norm_topk_prob=True)
#: The head layouts `build_tiny_moe_pair` writes.
MOE_LAYOUTS = ("standalone", "quantized", "bundled-per-expert", "bundled-fused")
#: The quantization of the `quantized` layout: 6-bit, with the router gates at 8 bits as mlx-lm's
#: `qwen3_5` quant predicate makes them (recorded per module path in `quantization`).
HEAD_BITS, GATE_BITS, GROUP_SIZE = 6, 8, 64


def moe_config() -> dict:
    text = qwen3_5_text_config(**{**TINY_HYBRID, "intermediate_size": 64})
    text.update(TINY_MOE, model_type="qwen3_5_moe_text", tie_word_embeddings=False)
    config = qwen3_5_config(text)
    config.update(model_type="qwen3_5_moe", architectures=["Qwen3_5MoeForConditionalGeneration"], tie_word_embeddings=False)
    return config


def _enlarge_embeddings(embed) -> None:
    embed.weight = embed.weight * EMBEDDING_GAIN


def _bigram_head(head) -> None:
    """Make the head pass the next token's embedding through and damp what its layers add (see tiny_hybrid)."""
    hidden = head.fc.weight.shape[0]
    head.fc.weight = mx.concatenate([mx.eye(hidden) * HEAD_EMBEDDING_GAIN, head.fc.weight[:, hidden:] * HEAD_HIDDEN_GAIN], axis=1)
    for layer in head.layers:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * HEAD_LAYER_GAIN
        mlp = layer.mlp
        if hasattr(mlp, "switch_mlp"):
            mlp.switch_mlp.down_proj.weight = mlp.switch_mlp.down_proj.weight * HEAD_LAYER_GAIN
            mlp.shared_expert.down_proj.weight = mlp.shared_expert.down_proj.weight * HEAD_LAYER_GAIN
        else:
            mlp.down_proj.weight = mlp.down_proj.weight * HEAD_LAYER_GAIN


def build_moe_target(seed: int = 0):
    from mlx_lm.models import qwen3_5_moe

    mx.random.seed(seed)
    config = moe_config()
    model = qwen3_5_moe.Model(qwen3_5_moe.ModelArgs.from_dict(config))
    _enlarge_embeddings(model.language_model.model.embed_tokens)
    mx.eval(model.parameters())
    model.eval()
    return model, config


def build_head_for(text_config: dict, seed: int = 0):
    """A `qwen3_5_mtp` head for this text config (MoE when it has experts) and its folder's config."""
    from mtpstack.worker.mtp.qwen3_5 import Head

    mx.random.seed(seed + 1)
    config = head_config(text_config)
    head = Head.from_config(config["text_config"])
    _bigram_head(head)
    mx.eval(head.parameters())
    head.eval()
    return head, config


def _gate_overrides(head) -> dict:
    return {path: {"group_size": GROUP_SIZE, "bits": GATE_BITS}
            for path, m in head.named_modules() if path.endswith(("mlp.gate", "mlp.shared_expert_gate"))}


def save_quantized_head(head, config: dict, out_dir: Path) -> Path:
    """The head quantized as mlx-vlm's converter writes a 6-bit MoE head: router gates at 8 bits, per path."""
    overrides = _gate_overrides(head)
    nn.quantize(head, group_size=GROUP_SIZE, bits=HEAD_BITS,
                class_predicate=lambda path, m: overrides.get(path, True) if hasattr(m, "to_quantized") else False)
    quantization = {"group_size": GROUP_SIZE, "bits": HEAD_BITS, "mode": "affine", **overrides}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), dict(tree_flatten(head.parameters())), metadata={"format": "mlx"})
    config = dict(config, quantization=quantization, quantization_config=quantization)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def _unstack_head_experts(weights: dict[str, mx.array], *, fused: bool) -> dict[str, mx.array]:
    """A head's stacked `switch_mlp` tensors as an original checkpoint stores them."""
    out = {}
    for key, w in weights.items():
        if ".switch_mlp." not in key:
            out[key] = w
            continue
        mlp, rest = key.split(".switch_mlp.")
        proj = rest.removesuffix(".weight")
        if fused:
            if proj == "gate_proj":
                out[f"{mlp}.experts.gate_up_proj"] = mx.concatenate([w, weights[f"{mlp}.switch_mlp.up_proj.weight"]], axis=-2)
            elif proj == "down_proj":
                out[f"{mlp}.experts.down_proj"] = w
        else:
            for e in range(w.shape[0]):
                out[f"{mlp}.experts.{e}.{proj}.weight"] = w[e]
    return out


def _fuse_target_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """The target's own experts as original Qwen3.5-MoE checkpoints store them: fused `gate_up_proj`."""
    out = {}
    for key, w in weights.items():
        if ".switch_mlp." not in key:
            out[key] = w
        elif key.endswith("switch_mlp.gate_proj.weight"):
            mlp = key.removesuffix(".switch_mlp.gate_proj.weight")
            out[f"{mlp}.experts.gate_up_proj"] = mx.concatenate([w, weights[f"{mlp}.switch_mlp.up_proj.weight"]], axis=-2)
        elif key.endswith("switch_mlp.down_proj.weight"):
            out[f"{key.removesuffix('.switch_mlp.down_proj.weight')}.experts.down_proj"] = w
    return out


def save_bundled(target, config: dict, head, out_dir: Path, *, fused: bool) -> Path:
    """The target in original (Hugging Face) layout with the head bundled as `mtp.*`."""
    weights = to_original_layout(_fuse_target_experts(dict(tree_flatten(target.parameters()))),
                                 _unstack_head_experts(dict(tree_flatten(head.parameters())), fused=fused))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "pt"})
    config = dict(config, text_config=dict(config["text_config"], mtp_num_hidden_layers=len(head.layers)))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, out_dir / name)
    return out_dir


def build_tiny_moe_pair(out_dir: Path, layout: str = "standalone", seed: int = 0) -> tuple[Path, Path]:
    """(target directory, drafter path) of the tiny MoE pair with its head in `layout` (`MOE_LAYOUTS`).

    A bundled head's drafter path is the target's own directory."""
    if layout not in MOE_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(MOE_LAYOUTS)}: {layout}")
    out_dir = Path(out_dir)
    target, config = build_moe_target(seed)
    head, hconfig = build_head_for(config["text_config"], seed)
    if layout.startswith("bundled"):
        directory = save_bundled(target, config, head, out_dir / "original", fused=layout == "bundled-fused")
        return directory, directory
    target_dir = save_model_dir(target, config, out_dir / "target")
    if layout == "quantized":
        return target_dir, save_quantized_head(head, hconfig, out_dir / "mtp")
    return target_dir, save_head_dir(head, hconfig, out_dir / "mtp")


#: Layouts `build_tiny_next_pair` writes.
NEXT_LAYOUTS = ("standalone", "bundled")


def next_config() -> dict:
    """A tiny Qwen3-Next config (flat, as its checkpoints have it): gated-delta + attention, MoE layers."""
    text = qwen3_5_text_config(**{**TINY_HYBRID, "intermediate_size": 64})
    rope = text.pop("rope_parameters")
    text.update(TINY_MOE, model_type="qwen3_next", tie_word_embeddings=False, mlp_only_layers=[], norm_topk_prob=False,
                rope_theta=rope["rope_theta"], partial_rotary_factor=rope["partial_rotary_factor"],
                architectures=["Qwen3NextForCausalLM"])
    return text


def build_next_target(seed: int = 0):
    from mlx_lm.models import qwen3_next

    mx.random.seed(seed)
    config = next_config()
    model = qwen3_next.Model(qwen3_next.ModelArgs.from_dict(config))
    _enlarge_embeddings(model.model.embed_tokens)
    mx.eval(model.parameters())
    model.eval()
    return model, config


def next_head_text_config(config: dict) -> dict:
    """The head folder's `text_config` as mlx-vlm's qwen3_next splitter writes it (rotary settings nested)."""
    rotary = int(config["head_dim"] * config["partial_rotary_factor"])
    return dict(config, rope_parameters={"type": "default", "rope_theta": config["rope_theta"],
                                         "partial_rotary_factor": config["partial_rotary_factor"],
                                         "mrope_section": [rotary // 2, 0, 0]})


def _next_original_layout(target_weights: dict[str, mx.array], head_weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """A Qwen3-Next original checkpoint: experts per expert, conv1d [C, 1, K], zero-centred norms, head as `mtp.*`."""
    out = {}
    norms = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight", "model.norm.weight")
    for key, w in target_weights.items():
        if ".switch_mlp." in key:
            mlp, rest = key.split(".switch_mlp.")
            for e in range(w.shape[0]):
                out[f"{mlp}.experts.{e}.{rest}"] = w[e]
            continue
        if "conv1d.weight" in key:
            w = w.moveaxis(2, 1)
        elif w.ndim == 1 and key.endswith(norms):
            w = w - 1.0
        out[key] = w
    return out | {k: v for k, v in to_original_layout({}, _unstack_head_experts(head_weights, fused=False)).items()}


def build_tiny_next_pair(out_dir: Path, layout: str = "standalone", seed: int = 0) -> tuple[Path, Path]:
    """(target directory, drafter path) of the tiny Qwen3-Next pair, its head standalone or bundled."""
    if layout not in NEXT_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(NEXT_LAYOUTS)}: {layout}")
    out_dir = Path(out_dir)
    target, config = build_next_target(seed)
    head, hconfig = build_head_for(next_head_text_config(config), seed)
    if layout == "standalone":
        return save_model_dir(target, config, out_dir / "target"), save_head_dir(head, hconfig, out_dir / "mtp")
    directory = out_dir / "original"
    directory.mkdir(parents=True, exist_ok=True)
    weights = _next_original_layout(dict(tree_flatten(target.parameters())), dict(tree_flatten(head.parameters())))
    mx.save_safetensors(str(directory / "model.safetensors"), weights, metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(dict(config, mtp_num_hidden_layers=1), indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, directory / name)
    return directory, directory


#: Layouts `build_tiny_nemotron_pair` writes.
NEMOTRON_LAYOUTS = ("standalone", "bundled")
#: Random Mamba2 mixers add more to the residual stream than Qwen's layers do: at the Qwen pairs'
#: gain of 8 the head agreed on about 7% of drafts, at 32 on about half (with 75 distinct tokens
#: over four 24-token answers, so the output still varies with context).
NEMOTRON_EMBEDDING_GAIN = 32.0


def nemotron_config() -> dict:
    """A tiny Nemotron-H config: Mamba2, attention and MoE blocks, and a one-module MTP head (`*E`)."""
    from devkit.demo.bpe import MODEL_MAX_LENGTH, VOCAB_SIZE, eos_token_ids

    return {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": VOCAB_SIZE,
        "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": MODEL_MAX_LENGTH,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "attention_bias": False,
        "mamba_num_heads": 4, "mamba_head_dim": 16, "mamba_proj_bias": False, "ssm_state_size": 16,
        "conv_kernel": 4, "n_groups": 1, "mlp_bias": False, "layer_norm_epsilon": 1e-5, "use_bias": False,
        "use_conv_bias": True, "hybrid_override_pattern": ["M", "*", "M", "E"],
        "moe_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64, "n_group": 1, "topk_group": 1,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "routed_scaling_factor": 1.0, "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E",
        "tie_word_embeddings": False, "torch_dtype": "float32", "eos_token_id": eos_token_ids(TOKENIZER_DIR),
    }


def build_nemotron_target(seed: int = 0):
    from mlx_lm.models import nemotron_h

    mx.random.seed(seed)
    config = nemotron_config()
    model = nemotron_h.Model(nemotron_h.ModelArgs.from_dict(config))
    embed = model.backbone.embeddings
    embed.weight = embed.weight * NEMOTRON_EMBEDDING_GAIN
    mx.eval(model.parameters())
    model.eval()
    return model, config


def build_nemotron_head(config: dict, seed: int = 0):
    """The `nemotron_h_mtp` head, passing the next token's embedding through (see `_bigram_head`), and its folder's config."""
    from mtpstack.worker.mtp.nemotron_h import Head

    mx.random.seed(seed + 1)
    head = Head.from_config(config)
    first = head.layers[0]
    hidden = config["hidden_size"]
    first.eh_proj.weight = mx.concatenate([mx.eye(hidden) * HEAD_EMBEDDING_GAIN, first.eh_proj.weight[:, hidden:] * HEAD_HIDDEN_GAIN], axis=1)
    for layer in head.layers:
        if layer.block_type == "*":
            layer.mixer.o_proj.weight = layer.mixer.o_proj.weight * HEAD_LAYER_GAIN
        elif layer.block_type == "E":
            layer.mixer.switch_mlp.fc2.weight = layer.mixer.switch_mlp.fc2.weight * HEAD_LAYER_GAIN
            layer.mixer.shared_experts.down_proj.weight = layer.mixer.shared_experts.down_proj.weight * HEAD_LAYER_GAIN
    mx.eval(head.parameters())
    head.eval()
    return head, {"model_type": "nemotron_h_mtp", "text_config": config, "block_size": 2, "tie_word_embeddings": False}


def _per_expert_nemotron(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Stacked `switch_mlp.fc1/fc2` as an original checkpoint stores them: `experts.E.up_proj/down_proj`."""
    out = {}
    for key, w in weights.items():
        if ".switch_mlp." in key:
            mixer, rest = key.split(".switch_mlp.")
            proj = {"fc1.weight": "up_proj", "fc2.weight": "down_proj"}[rest]
            for e in range(w.shape[0]):
                out[f"{mixer}.experts.{e}.{proj}.weight"] = w[e]
        else:
            out[key] = w
    return out


def build_tiny_nemotron_pair(out_dir: Path, layout: str = "standalone", seed: int = 0) -> tuple[Path, Path]:
    """(target directory, drafter path) of the tiny Nemotron-H pair, its head standalone or bundled."""
    if layout not in NEMOTRON_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(NEMOTRON_LAYOUTS)}: {layout}")
    out_dir = Path(out_dir)
    target, config = build_nemotron_target(seed)
    head, hconfig = build_nemotron_head(config, seed)
    if layout == "standalone":
        return save_model_dir(target, config, out_dir / "target"), save_head_dir(head, hconfig, out_dir / "mtp")
    directory = out_dir / "original"
    directory.mkdir(parents=True, exist_ok=True)
    weights = _per_expert_nemotron(dict(tree_flatten(target.parameters())))
    weights |= {f"mtp.{k}": v for k, v in _per_expert_nemotron(dict(tree_flatten(head.parameters()))).items()}
    weights = {k: (v.moveaxis(2, 1) if "conv1d.weight" in k else v) for k, v in weights.items()}
    mx.save_safetensors(str(directory / "model.safetensors"), weights, metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, directory / name)
    return directory, directory


#: Layouts `build_tiny_glm_pair` writes.
GLM_LAYOUTS = ("standalone", "bundled")


def glm_config() -> dict:
    """A tiny GLM-4.7-Flash (`glm4_moe_lite`) config: MLA attention, one dense layer then MoE layers."""
    from devkit.demo.bpe import MODEL_MAX_LENGTH, VOCAB_SIZE, eos_token_ids

    return {
        "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "vocab_size": VOCAB_SIZE,
        "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 4,
        "routed_scaling_factor": 1.0, "kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2, "moe_layer_freq": 1,
        "first_k_dense_replace": 1, "max_position_embeddings": MODEL_MAX_LENGTH, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
        "torch_dtype": "float32", "eos_token_id": eos_token_ids(TOKENIZER_DIR),
    }


def build_glm_target(seed: int = 0):
    from mlx_lm.models import glm4_moe_lite

    mx.random.seed(seed)
    config = glm_config()
    model = glm4_moe_lite.Model(glm4_moe_lite.ModelArgs.from_dict(config))
    _enlarge_embeddings(model.model.embed_tokens)
    mx.eval(model.parameters())
    model.eval()
    return model, config


def build_glm_head(target, config: dict, seed: int = 0):
    """The `glm4_moe_lite_mtp` head: the target's embeddings and output head as its own, passing the next
    token's embedding through (see `_bigram_head`); and its folder's config."""
    from mtpstack.worker.mtp.glm4_moe_lite import Head

    mx.random.seed(seed + 1)
    head = Head.from_config(config)
    m = head.model
    m.embed_tokens.weight = target.model.embed_tokens.weight
    head.lm_head.weight = target.lm_head.weight
    hidden = config["hidden_size"]
    m.eh_proj.weight = mx.concatenate([mx.eye(hidden) * HEAD_EMBEDDING_GAIN, m.eh_proj.weight[:, hidden:] * HEAD_HIDDEN_GAIN], axis=1)
    block = m.mtp_block
    block.self_attn.o_proj.weight = block.self_attn.o_proj.weight * HEAD_LAYER_GAIN
    block.mlp.switch_mlp.down_proj.weight = block.mlp.switch_mlp.down_proj.weight * HEAD_LAYER_GAIN
    block.mlp.shared_experts.down_proj.weight = block.mlp.shared_experts.down_proj.weight * HEAD_LAYER_GAIN
    mx.eval(head.parameters())
    head.eval()
    return head, {"model_type": "glm4_moe_lite_mtp", "text_config": config, "block_size": 2, "tie_word_embeddings": False}


def _glm_original(weights: dict[str, mx.array], config: dict, prefix: str) -> dict[str, mx.array]:
    """A GLM layer's tensors as the original checkpoint stores them: fused `kv_b_proj`, experts per expert."""
    out = {}
    heads, nope = config["num_attention_heads"], config["qk_nope_head_dim"]
    for key, w in weights.items():
        if key.endswith("self_attn.unembed_out.weight"):
            continue
        if key.endswith("self_attn.embed_q.weight"):
            attn = key.removesuffix(".embed_q.weight")
            fused = mx.concatenate([w.swapaxes(-1, -2), weights[f"{attn}.unembed_out.weight"]], axis=1)
            out[f"{prefix}{attn}.kv_b_proj.weight"] = fused.reshape(-1, fused.shape[-1])
        elif ".switch_mlp." in key:
            mlp, rest = key.split(".switch_mlp.")
            for e in range(w.shape[0]):
                out[f"{prefix}{mlp}.experts.{e}.{rest}"] = w[e]
        else:
            out[f"{prefix}{key}"] = w
    assert heads * (nope + config["v_head_dim"]) > 0
    return out


def build_tiny_glm_pair(out_dir: Path, layout: str = "standalone", seed: int = 0) -> tuple[Path, Path]:
    """(target directory, drafter path) of the tiny GLM-4.7-Flash pair, its head standalone or bundled."""
    if layout not in GLM_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(GLM_LAYOUTS)}: {layout}")
    out_dir = Path(out_dir)
    target, config = build_glm_target(seed)
    head, hconfig = build_glm_head(target, config, seed)
    if layout == "standalone":
        return save_model_dir(target, config, out_dir / "target"), save_head_dir(head, hconfig, out_dir / "mtp")
    directory = out_dir / "original"
    directory.mkdir(parents=True, exist_ok=True)
    weights = _glm_original(dict(tree_flatten(target.parameters())), config, "")
    flat = dict(tree_flatten(head.parameters()))
    nextn = f"model.layers.{config['num_hidden_layers']}."
    renamed = {"model.embed_tokens.weight": "embed_tokens.weight", "model.enorm.weight": "enorm.weight",
               "model.hnorm.weight": "hnorm.weight", "model.eh_proj.weight": "eh_proj.weight",
               "model.shared_head_norm.weight": "shared_head.norm.weight", "lm_head.weight": "shared_head.head.weight"}
    layer = {renamed.get(k, k.removeprefix("model.mtp_block.")): v for k, v in flat.items()}
    weights |= _glm_original(layer, config, nextn)
    mx.save_safetensors(str(directory / "model.safetensors"), weights, metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, directory / name)
    return directory, directory


# -- bench-size copies ---------------------------------------------------------------------

#: Config keys holding an MLP's or an expert's intermediate width, in every family here.
INTERMEDIATE_KEYS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "moe_shared_expert_intermediate_size")
#: Projections into the intermediate width (rows grow) and out of it (columns grow, with zeros).
INTO, OUT_OF = ("gate_proj.weight", "up_proj.weight", "fc1.weight"), ("down_proj.weight", "fc2.weight")


def widen_mlps(src_dir: Path, out_dir: Path, multiplier: int, seed: int = 0) -> Path:
    """A function-preserving copy of any family's model with every MLP and expert `multiplier` times wider.

    As `devkit.demo.widen` does for dense Qwen models: the new rows into the intermediate width are
    random (real work), the matching columns out of it zero, so greedy output is unchanged and
    decode reads `multiplier` times the MLP weights, closer to memory-bound as on real hardware.
    Experts (`[experts, out, in]`) grow the same way, each expert alike.
    """
    from devkit.demo.widen import INIT_STD

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    config = json.loads((src_dir / "config.json").read_text())
    key = mx.random.key(seed)
    out = {}
    for name, w in mx.load(str(src_dir / "model.safetensors")).items():
        if name.endswith(INTO):
            key, sub = mx.random.split(key)
            extra = list(w.shape)
            extra[-2] *= multiplier - 1
            w = mx.concatenate([w, mx.random.normal(tuple(extra), dtype=w.dtype, key=sub) * INIT_STD], axis=-2)
        elif name.endswith(OUT_OF):
            extra = list(w.shape)
            extra[-1] *= multiplier - 1
            w = mx.concatenate([w, mx.zeros(tuple(extra), dtype=w.dtype)], axis=-1)
        mx.eval(w)
        out[name] = w
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), out, metadata={"format": "mlx"})

    def wider(c: dict) -> dict:
        return {k: (v * multiplier if k in INTERMEDIATE_KEYS and isinstance(v, int) else v) for k, v in c.items()}

    config = wider(config)
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = wider(config["text_config"])
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (src_dir / name).is_file():
            shutil.copyfile(src_dir / name, out_dir / name)
    return out_dir


#: `--family` of the benches -> the standalone pair's builder.
PAIRS = {
    "qwen3_5": lambda out: build_tiny_hybrid_pair(out),
    "qwen3_5_moe": lambda out: build_tiny_moe_pair(out, "standalone"),
    "qwen3_next": lambda out: build_tiny_next_pair(out, "standalone"),
    "nemotron_h": lambda out: build_tiny_nemotron_pair(out, "standalone"),
    "glm4_moe_lite": lambda out: build_tiny_glm_pair(out, "standalone"),
}


def build_bench_pair(family: str, out_dir: Path, multiplier: int) -> tuple[Path, Path]:
    """The family's tiny pair with its target's MLPs widened `multiplier` times (the head unchanged)."""
    target, head = PAIRS[family](Path(out_dir) / "tiny")
    return widen_mlps(target, Path(out_dir) / "wide-target", multiplier), head
