"""The random tiny pair loads with mlx-lm, generates, and speculation never changes greedy text."""

import json

import pytest

mlx_lm = pytest.importorskip("mlx_lm")
from mlx_lm.generate import generate, stream_generate  # noqa: E402

from devkit.demo.tiny import build_tiny_pair  # noqa: E402

pytestmark = pytest.mark.mlx

PROMPTS = ["import os\n", "def main():\n", "The licence", "Copyright (C) 2020 ", "hello world"]


@pytest.fixture(scope="module")
def loaded(tiny_pair):
    target_dir, drafter_dir = tiny_pair
    target, tokenizer = mlx_lm.load(str(target_dir))
    drafter, _ = mlx_lm.load(str(drafter_dir))
    return target, drafter, tokenizer


def greedy(model, tokenizer, prompt, max_tokens=24, **kw):
    return [(r.token, r.from_draft) for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, **kw)]


def test_config_declares_what_the_worker_reads(tiny_pair):
    for model_dir in tiny_pair:
        config = json.loads((model_dir / "config.json").read_text())
        assert config["model_type"] == "qwen3"
        assert config["vocab_size"] == 1024
        assert config["torch_dtype"] == "float32"
        assert config["max_position_embeddings"] == 512
        assert (model_dir / "model.safetensors").is_file()
        assert (model_dir / "tokenizer.json").is_file()


def test_both_load_and_generate_text(loaded):
    target, drafter, tokenizer = loaded
    for model in (target, drafter):
        text = generate(model, tokenizer, "import os\n", max_tokens=8)
        assert isinstance(text, str) and text


def test_chat_template_is_chatml(loaded):
    _, _, tokenizer = loaded
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"
    ids = tokenizer.encode(prompt)
    assert tokenizer.decode(ids) == prompt


def test_greedy_output_depends_on_the_prompt(loaded):
    target, _, tokenizer = loaded
    outputs = {tuple(t for t, _ in greedy(target, tokenizer, p)) for p in PROMPTS}
    assert len(outputs) == len(PROMPTS)
    assert all(len(set(o)) > 3 for o in outputs), "a degenerate model repeats one token"


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_speculative_greedy_equals_plain_greedy(loaded, depth):
    target, drafter, tokenizer = loaded
    drafted = accepted = 0
    for prompt in PROMPTS:
        plain = greedy(target, tokenizer, prompt)
        spec = greedy(target, tokenizer, prompt, draft_model=drafter, num_draft_tokens=depth)
        assert [t for t, _ in spec] == [t for t, _ in plain]
        drafted += len(spec)
        accepted += sum(from_draft for _, from_draft in spec)
    # Both paths of the verifier ran: some drafts accepted, some rejected.
    assert 0 < accepted < drafted


def test_drafter_from_target_is_always_accepted(tmp_path):
    target_dir, drafter_dir = build_tiny_pair(tmp_path, seed=1, drafter_from_target=True)
    target, tokenizer = mlx_lm.load(str(target_dir))
    drafter, _ = mlx_lm.load(str(drafter_dir))
    assert (target_dir / "model.safetensors").read_bytes() == (drafter_dir / "model.safetensors").read_bytes()
    spec = greedy(target, tokenizer, "def main():\n", max_tokens=17, draft_model=drafter, num_draft_tokens=4)
    # Every step drafts 4 tokens, all accepted, and the target adds one more of its own.
    assert [f for _, f in spec] == ([True] * 4 + [False]) * 3 + [True, True]


def test_seed_changes_the_weights(tmp_path):
    a, _ = build_tiny_pair(tmp_path / "a", seed=0)
    b, _ = build_tiny_pair(tmp_path / "b", seed=0)
    c, _ = build_tiny_pair(tmp_path / "c", seed=1)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
