"""A tiny model pair in the Qwen3.5 family's chat format, for the agent-API tests.

Its tokenizer is the demo's with the family's markers and template (`devkit.demo.family`, the same
ones the shipped demo has), thinking on by default as in the real models' templates: the random
weights never close a think block, which is what the reasoning budget's tests need.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from tokenizers import Tokenizer

from devkit.demo import TOKENIZER_DIR
from devkit.demo.bpe import ENDOFTEXT, IM_END
from devkit.demo.family import write_family_tokenizer
from devkit.demo.modeldir import build_model, qwen3_config, save_model_dir
from devkit.demo.tiny import LATER_LAYER_GAIN, PROJECTION_GAIN, TINY_TARGET

#: Tool definitions fill the system prompt: 512 tokens are too few for them.
CONTEXT = 4096


def build_agent_tokenizer(out_dir: Path) -> int:
    """Write the tokenizer files to `out_dir`; return the vocabulary size (demo ids, then the markers)."""
    return write_family_tokenizer(TOKENIZER_DIR, out_dir, context=CONTEXT, thinking_by_default=True)


def build_agent_pair(out_dir: Path, *, seed: int = 0, drafter_from_target: bool = False) -> tuple[Path, Path]:
    """`out_dir/target` (2 layers x 64) and `out_dir/drafter` (its first layer, or a copy of it) on the agent tokenizer."""
    out_dir = Path(out_dir)
    tok_dir = out_dir / "tokenizer"
    vocab = build_agent_tokenizer(tok_dir)
    mx.random.seed(seed)
    config = qwen3_config(**TINY_TARGET, vocab_size=vocab, max_position_embeddings=CONTEXT)
    config["tie_word_embeddings"] = False
    config["eos_token_id"] = [Tokenizer.from_file(str(tok_dir / "tokenizer.json")).token_to_id(t) for t in (IM_END, ENDOFTEXT)]
    target = build_model(config)
    for i, layer in enumerate(target.model.layers):
        gain = PROJECTION_GAIN
        params = tree_flatten(layer.parameters())
        layer.update(tree_unflatten([(k, v * gain if k.endswith("proj.weight") else v) for k, v in params]))
        if i > 0:
            layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * LATER_LAYER_GAIN
            layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * LATER_LAYER_GAIN
    mx.eval(target.parameters())
    target_dir = save_model_dir(target, config, out_dir / "target", tokenizer_dir=tok_dir)
    drafter_dir = out_dir / "drafter"
    if drafter_from_target:
        shutil.copytree(target_dir, drafter_dir, dirs_exist_ok=True)
        return target_dir, drafter_dir
    drafter = build_model(dict(config, num_hidden_layers=1))
    drafter.model.embed_tokens = target.model.embed_tokens
    drafter.model.layers[0] = target.model.layers[0]
    drafter.model.norm = target.model.norm
    drafter.lm_head = target.lm_head
    save_model_dir(drafter, dict(config, num_hidden_layers=1), drafter_dir, tokenizer_dir=tok_dir)
    return target_dir, drafter_dir
