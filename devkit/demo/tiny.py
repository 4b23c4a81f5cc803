"""Random-weight tiny qwen3 pairs for tests: built and saved in well under a second.

The weights are random, so the text is gibberish, but every code path (loading, chat template,
KV caches, speculative verification) is the real one. Plain random initialisation makes a model
that repeats one token forever, which would let a broken decoder pass a test by luck; the weights
here are shaped so that greedy output varies with the prompt and a drafter agrees with the target
on part of the tokens (about half), so both accepted and rejected drafts occur.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from devkit.demo.modeldir import build_model, qwen3_config, save_model_dir

TINY_TARGET = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
)
TINY_DRAFTER = dict(TINY_TARGET, num_hidden_layers=1)
# Larger projections make attention and the MLP matter against the residual stream (so the output
# depends on the context); damping the target's later layers makes a drafter built from its first
# layer agree with it often but not always.
PROJECTION_GAIN = 4.0
LATER_LAYER_GAIN = 0.3


def _scale_projections(layer, gain: float) -> None:
    params = tree_flatten(layer.parameters())
    layer.update(tree_unflatten([(k, v * gain if k.endswith("proj.weight") else v) for k, v in params]))


def build_tiny_target(seed: int = 0):
    """The tiny random target model and its config (untied embeddings, 2 layers x 64)."""
    mx.random.seed(seed)
    config = qwen3_config(**TINY_TARGET)
    config["tie_word_embeddings"] = False
    model = build_model(config)
    for layer in model.model.layers:
        _scale_projections(layer, PROJECTION_GAIN)
    for layer in model.model.layers[1:]:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * LATER_LAYER_GAIN
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * LATER_LAYER_GAIN
    mx.eval(model.parameters())
    return model, config


def build_tiny_pair(out_dir: Path, *, seed: int = 0, drafter_from_target: bool = False) -> tuple[Path, Path]:
    """Write `out_dir/target` (2 layers x 64) and `out_dir/drafter` (1 layer x 64); return both paths.

    Both share the shipped demo tokenizer. The drafter is the target cut after its first layer
    (same embeddings, first layer, final norm and output head), an early-exit stand-in for an MTP
    head. With `drafter_from_target` the drafter is instead a byte-identical copy of the target,
    so every drafted token is accepted: useful to test acceptance accounting.
    """
    out_dir = Path(out_dir)
    target_dir, drafter_dir = out_dir / "target", out_dir / "drafter"
    target, target_config = build_tiny_target(seed)
    save_model_dir(target, target_config, target_dir)

    if drafter_from_target:
        if drafter_dir.exists():
            shutil.rmtree(drafter_dir)
        shutil.copytree(target_dir, drafter_dir)
        return target_dir, drafter_dir

    drafter_config = dict(target_config, num_hidden_layers=TINY_DRAFTER["num_hidden_layers"])
    drafter = build_model(drafter_config)
    drafter.model.embed_tokens = target.model.embed_tokens
    drafter.model.layers[0] = target.model.layers[0]
    drafter.model.norm = target.model.norm
    drafter.lm_head = target.lm_head
    save_model_dir(drafter, drafter_config, drafter_dir)
    return target_dir, drafter_dir
