"""The committed demo pair loads, fits the size budget, and its MTP head drafts the target's text well."""

import json
import math

import pytest

mlx_lm = pytest.importorskip("mlx_lm")
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.generate import stream_generate  # noqa: E402

from mtpstack.worker.demo import DEMO_DIR, DEMO_HEAD, DEMO_TARGET  # noqa: E402
from devkit.demo.acceptance import head_chain_steps  # noqa: E402
from mtpstack.worker.mtp import load_head  # noqa: E402

pytestmark = pytest.mark.mlx

if not (DEMO_TARGET / "model.safetensors").is_file():
    pytest.skip("the demo models are not in this checkout", allow_module_level=True)


@pytest.fixture(scope="module")
def demo():
    target, tokenizer = mlx_lm.load(str(DEMO_TARGET))
    return target, load_head(DEMO_HEAD, DEMO_TARGET).module, tokenizer


def test_demo_pair_fits_in_20_mb():
    total = sum(p.stat().st_size for d in (DEMO_TARGET, DEMO_HEAD) for p in d.iterdir())
    assert total <= 20 * 1024 * 1024


def test_demo_pair_is_a_qwen3_5_hybrid_and_its_standalone_head():
    target = json.loads((DEMO_TARGET / "config.json").read_text())
    head = json.loads((DEMO_HEAD / "config.json").read_text())
    assert target["model_type"] == "qwen3_5"
    text = target["text_config"]
    assert text["num_hidden_layers"] % text["full_attention_interval"] == 0 < text["num_hidden_layers"] // 2
    assert head["model_type"] == "qwen3_5_mtp"
    assert head["text_config"] == dict(text, mtp_num_hidden_layers=1)
    assert not (DEMO_DIR / "models" / "drafter").exists()


SAMPLE = (
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n        argv = sys.argv[1:]\n"
    "    for name in argv:\n        print(os.path.basename(name))\n    return 0\n\n"
    "This program is free software; you can redistribute it and/or modify it under the terms of the "
    "GNU General Public License as published by the Free Software Foundation.\n"
)


def test_target_and_head_predict_code_and_prose_far_better_than_chance(demo):
    target, head, tokenizer = demo
    chance = math.log(len(tokenizer.vocab))
    text = target.language_model.model
    ids = mx.array([tokenizer.encode(SAMPLE)])
    hidden = text(ids)
    next_token = nn.losses.cross_entropy(text.embed_tokens.as_linear(hidden[:, :-1]), ids[:, 1:], reduction="mean")
    out = head(text.embed_tokens(ids[:, 1:-1]), hidden[:, :-2], [None])
    token_after = nn.losses.cross_entropy(text.embed_tokens.as_linear(out), ids[:, 2:], reduction="mean")
    # Random weights score about ln(1024) = 6.9 nats or worse.
    assert next_token.item() < chance - 2.5
    assert token_after.item() < chance - 2.0


def test_demo_head_drafts_are_accepted_often(demo):
    target, head, tokenizer = demo
    prompt = tokenizer.encode("This program is free software; you can redistribute it")
    continuation = [r.token for r in stream_generate(target, tokenizer, prompt, max_tokens=64)]
    drafted, accepted = head_chain_steps(target, head, prompt, continuation, depth=1)
    # The old separate qwen3 drafter: 0.56 accepted per drafted token at depth 1 (0.36 of all tokens).
    assert accepted / drafted >= 0.6


# -- the Qwen3.5 family's chat format (`devkit.demo.extend`) ------------------------------------

FAMILY_MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def test_the_markers_follow_the_trained_ids_which_are_unchanged(demo):
    from tokenizers import Tokenizer

    from devkit.demo import TOKENIZER_DIR

    plain = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json")).get_vocab()
    shipped = Tokenizer.from_file(str(DEMO_TARGET / "tokenizer.json")).get_vocab()
    assert {t: i for t, i in shipped.items() if t not in FAMILY_MARKERS} == plain
    assert [shipped[m] for m in FAMILY_MARKERS] == list(range(len(plain), len(plain) + len(FAMILY_MARKERS)))
    target, head, tokenizer = demo
    rows = target.language_model.model.embed_tokens.weight.shape[0]
    config = json.loads((DEMO_TARGET / "config.json").read_text())
    assert rows == len(shipped) == config["text_config"]["vocab_size"]
    assert tokenizer.encode("<tool_call>\n<function=f>", add_special_tokens=False)[0] == shipped["<tool_call>"]


def test_mlx_lm_reads_the_qwen3_coder_tool_format_and_the_think_markers(demo):
    _, _, tokenizer = demo
    assert tokenizer.has_tool_calling and tokenizer.tool_parser.__module__.endswith(".qwen3_coder")
    assert (tokenizer.tool_call_start, tokenizer.tool_call_end) == ("<tool_call>", "</tool_call>")
    assert tokenizer.has_thinking and (tokenizer.think_start, tokenizer.think_end) == ("<think>", "</think>")


def test_the_context_holds_an_agents_prompt():
    target = json.loads((DEMO_TARGET / "config.json").read_text())
    head = json.loads((DEMO_HEAD / "config.json").read_text())
    tokenizer_config = json.loads((DEMO_TARGET / "tokenizer_config.json").read_text())
    # Claude Code sends 22-38k tokens before the conversation's first word (by version, tools and the
    # repository's instructions), Codex CLI about 17k; a session fills the rest. The prompt pass stays
    # correct out there: `python -m devkit.demo.long_context` (docs/demo-models.md).
    assert target["text_config"]["max_position_embeddings"] == tokenizer_config["model_max_length"] >= 131072
    assert head["text_config"]["max_position_embeddings"] == target["text_config"]["max_position_embeddings"]


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_the_template_renders_tools_calls_and_tool_messages_in_the_familys_form(demo):
    _, _, tokenizer = demo
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Look it up.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True, tokenize=False,
                                         enable_thinking=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and '"name": "get_weather"' in text
    assert ("<|im_start|>assistant\n<think>\nLook it up.\n</think>\n\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>\n") in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_thinking_is_off_unless_the_request_turns_it_on(demo):
    from mtpstack.worker.protocol.chat import render_template

    _, _, tokenizer = demo
    ask = [{"role": "user", "content": "hi"}]

    def ending(kwargs):
        return tokenizer.decode(render_template(tokenizer, ask, None, kwargs, add_generation_prompt=True))

    assert ending({}).endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert ending({"enable_thinking": False}) == ending({})
    # mlx-lm's own wrapper would have turned it on (it passes enable_thinking=True to any template with think markers).
    assert tokenizer.decode(tokenizer.apply_chat_template(ask, add_generation_prompt=True)) == ending({"enable_thinking": True})
    assert ending({"enable_thinking": True}).endswith("<|im_start|>assistant\n<think>\n")


def test_no_marker_ever_wins_the_greedy_choice_on_ordinary_text(demo):
    """The rows added for the markers leave the trained model's text as it was: at every position of
    code and prose (and of the model's own greedy continuation), the best token is an old one, by a margin."""
    target, head, tokenizer = demo
    base = target.language_model.model.embed_tokens.weight.shape[0] - len(FAMILY_MARKERS)
    text = target.language_model.model
    prompt = tokenizer.encode(SAMPLE)
    continuation = [r.token for r in stream_generate(target, tokenizer, prompt, max_tokens=64)]
    assert max(continuation) < base
    ids = mx.array([prompt + continuation])
    hidden = text(ids)
    logits = text.embed_tokens.as_linear(hidden)[0]
    # 0.5, not the 1.0 the head keeps: taught to open an agent's answer with `<tool_call>` (devkit.demo.act),
    # the target keeps that marker 0.61 below the winner here (2.08 before).
    assert (logits[:, :base].max(axis=-1) - logits[:, base:].max(axis=-1)).min().item() > 0.5
    # The head borrows the same rows for its drafts.
    out = head(text.embed_tokens(ids[:, 1:]), hidden[:, :-1], [None])
    drafts = text.embed_tokens.as_linear(out)[0]
    assert (drafts[:, :base].max(axis=-1) - drafts[:, base:].max(axis=-1)).min().item() > 1.0


# -- ending its turns (`devkit.demo.chat`) ------------------------------------------------------


def test_the_demo_ends_its_turns_so_the_teaching_step_leaves_it_as_it_is(tmp_path):
    """Short chats, thinking off and on: every greedy answer ends with `<|im_end|>` (an agent that
    checks, like Codex, gives up on one cut at `max_tokens`), so `devkit.demo.chat` on a copy of the
    shipped pair finds nothing to do and writes nothing."""
    import hashlib
    import shutil

    from devkit.demo.chat import CHECK_PROMPTS, GATED, teach

    copy = tmp_path / "models"
    shutil.copytree(DEMO_DIR / "models", copy)

    def digests():
        return {p.relative_to(copy): hashlib.sha256(p.read_bytes()).hexdigest() for p in copy.rglob("*") if p.is_file()}

    before = digests()
    done = teach(copy)
    assert len(done["checked"]) == 2 * (len(CHECK_PROMPTS) + 1)
    assert [answer for answer, ended in done["checked"][:GATED] if not ended] == []
    assert done["target_steps"] == 0 and digests() == before
