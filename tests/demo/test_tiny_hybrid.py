"""The tiny Qwen3.5-family pair: the target loads with mlx-lm, the head with mtpstack.worker.mtp, bundled or standalone."""

import json

import pytest

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")
from mlx_lm.generate import stream_generate  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

from devkit.demo.tiny_hybrid import (  # noqa: E402
    build_tiny_bundled_checkpoint,
    build_tiny_hybrid_pair,
    build_tiny_hybrid_target,
)
from mtpstack.worker.mtp import load_head  # noqa: E402
from mtpstack.worker.mtp.load import HeadLoadError  # noqa: E402

pytestmark = pytest.mark.mlx

PROMPTS = ["import os\n", "def main():\n", "The licence", "Copyright (C) 2020 ", "hello world"]
HEAD_TENSORS = {
    "fc.weight": (64, 128),
    "pre_fc_norm_embedding.weight": (64,),
    "pre_fc_norm_hidden.weight": (64,),
    "layers.0.self_attn.q_proj.weight": (128, 64),  # 4 heads x 16, doubled for the output gate
    "layers.0.self_attn.k_proj.weight": (32, 64),
    "layers.0.self_attn.v_proj.weight": (32, 64),
    "layers.0.self_attn.o_proj.weight": (64, 64),
    "layers.0.self_attn.q_norm.weight": (16,),
    "layers.0.self_attn.k_norm.weight": (16,),
    "layers.0.mlp.gate_proj.weight": (128, 64),
    "layers.0.mlp.up_proj.weight": (128, 64),
    "layers.0.mlp.down_proj.weight": (64, 128),
    "layers.0.input_layernorm.weight": (64,),
    "layers.0.post_attention_layernorm.weight": (64,),
    "norm.weight": (64,),
}


@pytest.fixture(scope="module")
def pair(hybrid_pair):
    return hybrid_pair


@pytest.fixture(scope="module")
def loaded(pair):
    target_dir, head_dir = pair
    target, tokenizer = mlx_lm.load(str(target_dir))
    return target, load_head(head_dir, target_dir).module, tokenizer


def greedy(model, tokenizer, prompt, max_tokens=24):
    return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens)]


def test_folders_are_a_qwen3_5_target_and_a_standalone_qwen3_5_mtp_head(pair):
    target_dir, head_dir = pair
    target = json.loads((target_dir / "config.json").read_text())
    head = json.loads((head_dir / "config.json").read_text())
    assert target["model_type"] == "qwen3_5"
    assert head["model_type"] == "qwen3_5_mtp" and head["block_size"] == 3
    assert head["text_config"] == dict(target["text_config"], mtp_num_hidden_layers=1)
    tensors = {k: tuple(v.shape) for k, v in mx.load(str(head_dir / "model.safetensors")).items()}
    assert tensors == HEAD_TENSORS
    assert not (head_dir / "tokenizer.json").exists()  # the head borrows the target's


def test_target_is_hybrid_and_loads_to_the_model_that_was_built(pair):
    model, _ = load_model(pair[0])
    assert [layer.is_linear for layer in model.layers] == [True, False, True, False]
    built, _ = build_tiny_hybrid_target(seed=0)
    tokens = mx.array([[5, 300, 17, 900, 42, 8, 8, 64]])
    # Saved already sanitized: a second conv1d moveaxis or +1 norm shift on load would change the logits.
    assert mx.array_equal(model(tokens), built(tokens))


def test_greedy_output_depends_on_the_prompt(loaded):
    target, _, tokenizer = loaded
    outputs = {tuple(greedy(target, tokenizer, p)) for p in PROMPTS}
    assert len(outputs) == len(PROMPTS)
    assert all(len(set(o)) > 3 for o in outputs), "a degenerate model repeats one token"


def test_head_agrees_with_the_target_on_part_of_the_tokens(loaded):
    target, head, tokenizer = loaded
    text = target.language_model.model
    agree = total = 0
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        seq = mx.array([ids + greedy(target, tokenizer, prompt)])
        hidden = text(seq)
        # The head at t sees h[t] and token t+1, and drafts token t+2.
        out = head(text.embed_tokens(seq[:, 1:]), hidden[:, :-1], [None])
        drafts = mx.argmax(target.language_model.lm_head(out), axis=-1)[0, len(ids) - 1 : -1]
        truth = seq[0, len(ids) + 1 :]
        agree += (drafts == truth).sum().item()
        total += truth.size
    assert 0.2 * total < agree < 0.9 * total


def test_head_folder_missing_a_tensor_is_refused(pair, tmp_path):
    target_dir, head_dir = pair
    weights = mx.load(str(head_dir / "model.safetensors"))
    del weights["norm.weight"]
    broken = tmp_path / "mtp"
    broken.mkdir()
    mx.save_safetensors(str(broken / "model.safetensors"), weights)
    (broken / "config.json").write_text((head_dir / "config.json").read_text())
    with pytest.raises(HeadLoadError):
        load_head(broken, target_dir)


def test_bundled_checkpoint_loads_to_the_same_target_and_head(pair, loaded, tmp_path):
    target_dir, head_dir = pair
    bundled = build_tiny_bundled_checkpoint(tmp_path / "bundled", seed=0)
    tensors = mx.load(str(bundled / "model.safetensors"))
    # Original layout: HF names, conv1d as [C, 1, K], zero-centred norms, head as `mtp.*`.
    assert "model.language_model.embed_tokens.weight" in tensors and "lm_head.weight" in tensors
    assert tensors["model.language_model.layers.0.linear_attn.conv1d.weight"].shape[1] == 1
    assert mx.array_equal(tensors["mtp.norm.weight"] + 1.0, mx.load(str(head_dir / "model.safetensors"))["norm.weight"])

    model, _ = load_model(bundled)
    standalone_target, standalone_head, _ = loaded
    tokens = mx.array([[5, 300, 17, 900, 42, 8, 8, 64]])
    assert mx.array_equal(model(tokens), standalone_target(tokens))

    head = load_head(bundled, bundled)
    assert head.bundled
    text = model.language_model.model
    embeddings, hidden = text.embed_tokens(tokens[:, 1:]), text(tokens)[:, :-1]
    assert mx.array_equal(head.module(embeddings, hidden, [None]), standalone_head(embeddings, hidden, [None]))


def test_seed_fixes_the_weights(tmp_path):
    a = build_tiny_hybrid_pair(tmp_path / "a", seed=0)
    b = build_tiny_hybrid_pair(tmp_path / "b", seed=0)
    c = build_tiny_hybrid_pair(tmp_path / "c", seed=1)
    for x, y, z in zip(a, b, c):
        assert (x / "model.safetensors").read_bytes() == (y / "model.safetensors").read_bytes()
        assert (x / "model.safetensors").read_bytes() != (z / "model.safetensors").read_bytes()


def test_head_chain_acceptance_counts_accepted_prefixes(loaded):
    from devkit.demo.acceptance import head_chain_steps

    target, head, tokenizer = loaded
    ids = tokenizer.encode("def main():\n")
    continuation = greedy(target, tokenizer, "def main():\n", max_tokens=32)
    drafted1, accepted1 = head_chain_steps(target, head, ids, continuation, depth=1)
    # Depth 1: one draft per step, and every step advances by its accepted draft plus the target's token
    # (the last step's own token may fall past the end of the continuation).
    assert drafted1 + accepted1 in (len(continuation) - 1, len(continuation))
    assert 0 < accepted1 < drafted1
    drafted3, accepted3 = head_chain_steps(target, head, ids, continuation, depth=3)
    assert accepted3 <= drafted3 and drafted3 > drafted1
