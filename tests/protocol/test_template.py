"""The worker applies a chat template as transformers does: a thinking switch the request leaves unset
is the template's own default (mlx-lm's wrapper would pass `enable_thinking=True` to every template
with think markers)."""

from __future__ import annotations

import pytest
from mlx_lm.utils import load_tokenizer

from devkit.demo import TOKENIZER_DIR
from devkit.demo.family import write_family_tokenizer
from mtpstack.worker.protocol.chat import render_template

ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


@pytest.fixture(scope="module", params=[True, False], ids=["thinking-by-default", "thinking-off-by-default"])
def family(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("family")
    write_family_tokenizer(TOKENIZER_DIR, d, context=4096, thinking_by_default=request.param)
    return load_tokenizer(d), request.param


def test_an_unset_switch_is_the_templates_default_and_a_set_one_is_passed_through(family):
    tok, default = family
    text = lambda kwargs: tok.decode(render_template(tok, ASK, None, kwargs, add_generation_prompt=True))  # noqa: E731
    assert text({}) == text({"enable_thinking": default})
    assert text({"enable_thinking": True}).endswith("assistant\n<think>\n")
    assert text({"enable_thinking": False}).endswith("assistant\n<think>\n\n</think>\n\n")
    # Where the template's default is on (the real Qwen3.5 templates), the prompt is exactly mlx-lm's.
    if default:
        assert render_template(tok, ASK, None, {}, add_generation_prompt=True) == list(
            tok.apply_chat_template(ASK, add_generation_prompt=True))


def test_a_template_without_think_markers_renders_as_mlx_lm_renders_it():
    tok = load_tokenizer(TOKENIZER_DIR)
    assert not tok.has_thinking
    assert render_template(tok, ASK, None, {}, add_generation_prompt=True) == list(
        tok.apply_chat_template(ASK, add_generation_prompt=True))
