"""The widened copy computes what the original computes: same greedy tokens, more weights to read."""

import json

import pytest

mlx_lm = pytest.importorskip("mlx_lm")
from mlx_lm.generate import stream_generate  # noqa: E402

from devkit.demo.widen import main, parameter_count, widen  # noqa: E402

pytestmark = pytest.mark.mlx

PROMPTS = ["import os\n", "def main():\n", "The licence", "Copyright (C) 2020 "]


def greedy_tokens(model, tokenizer, prompt, max_tokens=24):
    return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens)]


@pytest.fixture(scope="module")
def widened(tiny_pair, tmp_path_factory):
    target_dir, _ = tiny_pair
    return widen(target_dir, tmp_path_factory.mktemp("wide") / "target", mlp_multiplier=3, extra_layers=2)


def test_widened_config_and_size(tiny_pair, widened):
    source = json.loads((tiny_pair[0] / "config.json").read_text())
    config = json.loads((widened / "config.json").read_text())
    assert config["intermediate_size"] == 3 * source["intermediate_size"]
    assert config["num_hidden_layers"] == source["num_hidden_layers"] + 2
    assert parameter_count(widened) > 2 * parameter_count(tiny_pair[0])


def test_widened_greedy_output_equals_original(tiny_pair, widened):
    original, tokenizer = mlx_lm.load(str(tiny_pair[0]))
    wide, wide_tokenizer = mlx_lm.load(str(widened))
    assert wide_tokenizer.encode("import os") == tokenizer.encode("import os")
    for prompt in PROMPTS:
        assert greedy_tokens(wide, tokenizer, prompt) == greedy_tokens(original, tokenizer, prompt)


def test_widened_target_with_drafter_keeps_greedy_output(tiny_pair, widened):
    original, tokenizer = mlx_lm.load(str(tiny_pair[0]))
    wide, _ = mlx_lm.load(str(widened))
    drafter, _ = mlx_lm.load(str(tiny_pair[1]))
    spec = [
        r.token
        for r in stream_generate(wide, tokenizer, "def main():\n", max_tokens=24, draft_model=drafter,
                                 num_draft_tokens=3)
    ]
    assert spec == greedy_tokens(original, tokenizer, "def main():\n")


def test_cli_rejects_a_directory_without_a_model(tmp_path, capsys):
    assert main([str(tmp_path), str(tmp_path / "out"), "--mlp-multiplier", "2", "--extra-layers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: No `config.json` in the source model directory: ")
    assert not (tmp_path / "out").exists()


def test_cli_writes_the_copy_and_prints_its_path(tiny_pair, tmp_path, capsys):
    out = tmp_path / "wide"
    assert main([str(tiny_pair[0]), str(out), "--mlp-multiplier", "1", "--extra-layers", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3


@pytest.fixture(scope="module")
def widened_hybrid(hybrid_pair, tmp_path_factory):
    target_dir, _ = hybrid_pair
    return widen(target_dir, tmp_path_factory.mktemp("wide-hybrid") / "target", mlp_multiplier=3, extra_layers=3)


def test_widened_hybrid_continues_the_layer_pattern(hybrid_pair, widened_hybrid):
    from mlx_lm.utils import load_model

    source = json.loads((hybrid_pair[0] / "config.json").read_text())["text_config"]
    config = json.loads((widened_hybrid / "config.json").read_text())
    assert config["model_type"] == "qwen3_5"
    assert config["text_config"]["intermediate_size"] == 3 * source["intermediate_size"]
    assert config["text_config"]["num_hidden_layers"] == source["num_hidden_layers"] + 3
    model, _ = load_model(widened_hybrid)  # strict: every tensor of every new layer is there
    assert [layer.is_linear for layer in model.layers] == [True, False] * 3 + [True]
    assert parameter_count(widened_hybrid) > 2 * parameter_count(hybrid_pair[0])


def test_widened_hybrid_greedy_output_equals_original(hybrid_pair, widened_hybrid):
    original, tokenizer = mlx_lm.load(str(hybrid_pair[0]))
    wide, _ = mlx_lm.load(str(widened_hybrid))
    for prompt in PROMPTS:
        assert greedy_tokens(wide, tokenizer, prompt) == greedy_tokens(original, tokenizer, prompt)
