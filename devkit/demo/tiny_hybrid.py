"""Random-weight tiny Qwen3.5-family pairs for tests: a hybrid target and its MTP head, in well under a second.

The target is mlx-lm's own `qwen3_5` class (4 layers x 64: gated-delta linear attention at layers
0 and 2, full attention at 1 and 3; untied LM head) with the demo tokenizer; the head is
`mtpstack.worker.mtp`'s `Qwen35MTPHead`, saved as a standalone `qwen3_5_mtp` folder. As in
`devkit.demo.tiny`, plain random weights would make a degenerate pair (a tied target repeats its
input token; a random head never agrees with its target). Here the target's embeddings are enlarged
so the current token dominates its residual stream while the context still shifts its choice, and
the head passes the next token's embedding through almost unchanged: it drafts the target's
"bigram" choice. Greedy output varies with the prompt, and the head agrees with the target on
about half of the tokens, so both accepted and rejected drafts occur.

`build_tiny_bundled_checkpoint` writes the same target in the original (Hugging Face) layout with
the head bundled as `mtp.*` tensors, for loader tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from devkit.demo import TOKENIZER_DIR
from devkit.demo.bpe import TOKENIZER_FILES
from devkit.demo.modeldir import (
    build_head,
    build_qwen3_5,
    head_config,
    qwen3_5_config,
    qwen3_5_text_config,
    save_head_dir,
    save_model_dir,
)
from mtpstack.worker.mtp.qwen3_5 import ZERO_CENTRED_NORMS

TINY_HYBRID = dict(
    hidden_size=64, num_hidden_layers=4, intermediate_size=128, full_attention_interval=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)
# A larger embedding keeps the current token strong in the residual stream, so the context shifts
# the target's choice often but not always (see `build_tiny_hybrid_head`).
EMBEDDING_GAIN = 8.0
# The head follows its embedding input: see `build_tiny_hybrid_head`.
HEAD_EMBEDDING_GAIN = 1.0
HEAD_HIDDEN_GAIN = 0.1
HEAD_LAYER_GAIN = 0.1


def build_tiny_hybrid_target(seed: int = 0, **dims):
    """The tiny random qwen3_5 target (untied LM head) and its config.json dict; `dims` override
    `TINY_HYBRID`'s (a wider KV, a longer context) for tests that need another shape."""
    mx.random.seed(seed)
    config = qwen3_5_config(qwen3_5_text_config(**{**TINY_HYBRID, **dims}))
    config["tie_word_embeddings"] = config["text_config"]["tie_word_embeddings"] = False
    model = build_qwen3_5(config)
    text = model.language_model.model
    text.embed_tokens.weight = text.embed_tokens.weight * EMBEDDING_GAIN
    mx.eval(model.parameters())
    model.eval()
    return model, config


def build_tiny_hybrid_head(target, target_config: dict, seed: int = 0):
    """The tiny head for `target` and its folder's config.json dict.

    `fc` passes the (normalised) embedding of the next token straight through and the layer's
    output projections are damped, so the head's output is close to what the target's own final
    hidden state is when that token's embedding dominates its residual stream: a bigram guess
    of the target, right where context matters little and wrong where it matters much.
    """
    mx.random.seed(seed + 1)
    config = head_config(target_config["text_config"])
    head = build_head(config)
    hidden = target_config["text_config"]["hidden_size"]
    head.fc.weight = mx.concatenate(
        [mx.eye(hidden) * HEAD_EMBEDDING_GAIN, head.fc.weight[:, hidden:] * HEAD_HIDDEN_GAIN], axis=1
    )
    layer = head.layers[0]
    layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * HEAD_LAYER_GAIN
    layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * HEAD_LAYER_GAIN
    mx.eval(head.parameters())
    head.eval()
    return head, config


def build_tiny_hybrid_pair(out_dir: Path, seed: int = 0, **dims) -> tuple[Path, Path]:
    """Write `out_dir/target` (a qwen3_5 model directory) and `out_dir/mtp` (its head folder); return both."""
    out_dir = Path(out_dir)
    target, config = build_tiny_hybrid_target(seed, **dims)
    head, hconfig = build_tiny_hybrid_head(target, config, seed)
    return save_model_dir(target, config, out_dir / "target"), save_head_dir(head, hconfig, out_dir / "mtp")


def to_original_layout(target_weights: dict[str, mx.array], head_weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlx-format target and head tensors as an original (Hugging Face) checkpoint holds them.

    Target keys `language_model.model.*` become `model.language_model.*`, conv1d weights go back
    from [C, K, 1] to [C, 1, K], and the zero-centred RMSNorms (the layer norms, q/k norms, the
    final norm; not the gated-delta norm) are stored as `w - 1`; the head's tensors become `mtp.*`
    with all their norms zero-centred. mlx-lm's `qwen3_5.Model.sanitize` undoes all of it on load.
    """
    out = {}
    for key, w in target_weights.items():
        key = key.replace("language_model.model.", "model.language_model.", 1)
        key = key.replace("language_model.lm_head.", "lm_head.", 1)
        if "conv1d.weight" in key:
            w = w.moveaxis(2, 1)
        elif w.ndim == 1 and key.endswith(
            (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight",
             "model.language_model.norm.weight")
        ):
            w = w - 1.0
        out[key] = w
    for key, w in head_weights.items():
        if w.ndim == 1 and key.endswith(ZERO_CENTRED_NORMS):
            w = w - 1.0
        out[f"mtp.{key}"] = w
    return out


def build_tiny_bundled_checkpoint(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny target in original layout with its head bundled as `mtp.*`; return the directory.

    The target and head are those of `build_tiny_hybrid_pair(..., seed)`, so the bundled head must
    load to exactly the standalone one.
    """
    out_dir = Path(out_dir)
    target, config = build_tiny_hybrid_target(seed)
    head, _ = build_tiny_hybrid_head(target, config, seed)
    weights = to_original_layout(dict(tree_flatten(target.parameters())), dict(tree_flatten(head.parameters())))
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "pt"})
    config = dict(config, text_config=dict(config["text_config"], mtp_num_hidden_layers=1))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, out_dir / name)
    return out_dir
