"""Model directories as mlx-lm loads them: `config.json`, `model.safetensors`, tokenizer files.

Models are built with mlx-lm's own classes (qwen3, and the Qwen3.5-family hybrid `qwen3_5`), so what
the demo ships is exactly what `mlx_lm.load` reconstructs; nothing here re-implements an
architecture. MTP heads are `mtpstack.worker.mtp`'s module, saved as the standalone `qwen3_5_mtp` folder
that mlx-vlm's splitter writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3, qwen3_5

from devkit.demo import TOKENIZER_DIR
from devkit.demo.bpe import MODEL_MAX_LENGTH, TOKENIZER_FILES, VOCAB_SIZE, eos_token_ids


def qwen3_config(
    *,
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int | None = None,
    vocab_size: int = VOCAB_SIZE,
    max_position_embeddings: int = MODEL_MAX_LENGTH,
) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim or hidden_size // num_attention_heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "eos_token_id": eos_token_ids(TOKENIZER_DIR),
    }


def build_model(config: dict) -> qwen3.Model:
    """A qwen3 model with mlx's default (random) initialisation; seed with `mx.random.seed` first."""
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model


def mrope_section(head_dim: int, partial_rotary_factor: float) -> list[int]:
    """The family's split of the rotary frequencies into (time, height, width) sections, as Qwen3.5 configs have it.

    Text-only positions are equal in all three, so the split does not change the maths (mlx-lm ignores
    it); mlx-vlm, the reference the tests and the bench compare against, requires it to load the model.
    """
    frequencies = int(head_dim * partial_rotary_factor) // 2
    side = round(frequencies * 11 / 32)  # Qwen3.5's own [11, 11, 10] of 32
    return [side, side, frequencies - 2 * side]


def qwen3_5_text_config(
    *,
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    full_attention_interval: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int,
    linear_num_key_heads: int,
    linear_num_value_heads: int,
    linear_key_head_dim: int,
    linear_value_head_dim: int,
    linear_conv_kernel_dim: int = 4,
    vocab_size: int = VOCAB_SIZE,
    max_position_embeddings: int = MODEL_MAX_LENGTH,
) -> dict:
    """The `text_config` of a Qwen3.5-family hybrid (gated-delta linear attention + full attention)."""
    return {
        "model_type": "qwen3_5",
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "intermediate_size": intermediate_size,
        "full_attention_interval": full_attention_interval,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "linear_num_key_heads": linear_num_key_heads,
        "linear_num_value_heads": linear_num_value_heads,
        "linear_key_head_dim": linear_key_head_dim,
        "linear_value_head_dim": linear_value_head_dim,
        "linear_conv_kernel_dim": linear_conv_kernel_dim,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": mrope_section(head_dim, 0.25),
        },
        "tie_word_embeddings": True,
        "attention_bias": False,
        "torch_dtype": "float32",
        "eos_token_id": eos_token_ids(TOKENIZER_DIR),
    }


def qwen3_5_config(text_config: dict) -> dict:
    """The model directory's `config.json`: `model_type` qwen3_5 wrapping the text config, as mlx-lm reads it."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_config,
        "tie_word_embeddings": text_config["tie_word_embeddings"],
        "torch_dtype": "float32",
        "eos_token_id": text_config["eos_token_id"],
    }


def build_qwen3_5(config: dict) -> qwen3_5.Model:
    """A qwen3_5 model with mlx-lm's default (random) initialisation; seed with `mx.random.seed` first."""
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model


def head_config(text_config: dict, *, num_layers: int = 1, block_size: int = 3) -> dict:
    """`config.json` of a standalone `qwen3_5_mtp` head folder, as mlx-vlm's splitter writes it."""
    return {
        "model_type": "qwen3_5_mtp",
        "text_config": dict(text_config, mtp_num_hidden_layers=num_layers),
        "block_size": block_size,
        "tie_word_embeddings": True,
    }


def build_head(config: dict):
    """A `mtpstack.worker.mtp` head (random weights) for a head folder's config."""
    from mtpstack.worker.mtp.qwen3_5 import Head

    head = Head.from_config(config["text_config"])
    mx.eval(head.parameters())
    return head


def save_head_dir(head, config: dict, out_dir: Path) -> Path:
    """Write a standalone head folder: `config.json` and the head's own tensors (norms as `1 + w`), fp32."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.float32) for k, v in tree_flatten(head.parameters())}
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def parameter_count(model) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


def save_model_dir(model, config: dict, out_dir: Path, *, tokenizer_dir: Path = TOKENIZER_DIR) -> Path:
    """Write a directory that `mlx_lm.load(out_dir)` loads: weights in fp32, config and tokenizer."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out_dir / name)
    return out_dir


def load_config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())
