"""Qwen3 model directories as mlx-lm loads them: `config.json`, `model.safetensors`, tokenizer files.

Models are built with mlx-lm's own qwen3 class, so what the demo ships is exactly what
`mlx_lm.load` reconstructs; nothing here re-implements the architecture.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3

from worker.demo import TOKENIZER_DIR
from worker.demo.bpe import MODEL_MAX_LENGTH, TOKENIZER_FILES, VOCAB_SIZE, eos_token_ids


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
