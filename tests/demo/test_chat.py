"""`devkit.demo.chat`'s conversations: cut from documents, rendered as the worker renders a request, each
answer the turn's first line repeated, cut short, ending in `<|im_end|>` with the weights the fine-tune gives its labels."""

from __future__ import annotations

import numpy as np
import pytest

mlx_lm = pytest.importorskip("mlx_lm")

from devkit.demo import chat  # noqa: E402
from mtpstack.worker.demo import DEMO_TARGET  # noqa: E402
from mtpstack.worker.protocol.chat import render_template  # noqa: E402

pytestmark = pytest.mark.mlx

DOCS = [
    "def parse(path):\n    with open(path) as f:\n        data = f.read()\n    return data.split()\n"
    "\n\nclass Reader:\n    def __init__(self, stream):\n        self.stream = stream\n",
    "This program is free software; you can redistribute it and/or modify it under the terms of the GNU General "
    "Public License\nas published by the Free Software Foundation.\n  * New upstream release.\n"
    "  * Fix the build with the newest compiler, which rejects an implicit declaration in a very long line here\n"
    "Permission is hereby granted.\n",
]


@pytest.fixture(scope="module")
def tokenizer():
    return mlx_lm.load(str(DEMO_TARGET))[1]


def test_answers_repeat_the_first_line_of_their_user_turn_cut_short():
    convos = chat.conversations(DOCS, np.random.default_rng(0))
    assert convos
    lines = {line.rstrip() for d in DOCS for line in d.splitlines()}
    for messages, answer, _ in convos:
        assert 0 < len(answer) <= chat.ANSWER_CHARS and "\n" not in answer
        assert any(line.strip().startswith(answer) for line in lines)
        assert messages[-1]["role"] == "user" and messages[-1]["content"].startswith(answer)
        # Earlier answers stay in the history, as an agent resends them.
        assert all(m["role"] in ("system", "user", "assistant") for m in messages)


def test_a_long_line_is_cut_at_a_word_boundary_or_skipped():
    assert chat._short("a short line") == "a short line"
    cut = chat._short("word " * 30)
    assert cut and len(cut) <= chat.ANSWER_CHARS and cut.endswith("word")
    assert chat._short("x" * 200) == ""


@pytest.mark.parametrize("thinking", [False, True])
def test_a_conversation_is_the_workers_prompt_then_the_answer_and_im_end_weighted(tokenizer, thinking):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "import os"}]
    ids, weights = chat.encode(tokenizer, (messages, "import sys", thinking))
    prompt = list(render_template(tokenizer, messages, None, {"enable_thinking": thinking}, add_generation_prompt=True))
    assert ids[: len(prompt)] == prompt and len(weights) == len(ids)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    said = tokenizer.decode(ids[len(prompt) : ids.index(end, len(prompt))])
    assert said.endswith("import sys") and ("</think>" in said) == thinking
    assert weights[ids.index(end, len(prompt))] == chat.END_WEIGHT
    assert set(weights[: len(prompt)]) == {chat.PROMPT_WEIGHT}
    assert tokenizer.decode(ids[ids.index(end, len(prompt)) :]) == "<|im_end|>\n"


def test_the_agent_sized_check_prompt_is_as_long_as_codexs(tokenizer):
    messages = chat.long_instructions()
    prompt = render_template(tokenizer, messages, None, {}, add_generation_prompt=True)
    assert 5_000 < len(prompt) < 12_000


def test_a_checkpoint_restores_the_weights_and_the_step_it_was_written_at(tmp_path):
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map

    target = mlx_lm.load(str(DEMO_TARGET))[0]
    path = tmp_path / chat.CHECKPOINT
    chat._checkpoint(target, path, 340)
    fresh = mlx_lm.load(str(DEMO_TARGET))[0]
    fresh.update(tree_map(mx.zeros_like, fresh.parameters()))
    assert chat._restore(fresh, path) == 340
    assert all(mx.array_equal(a, b) for (_, a), (_, b) in zip(tree_flatten(fresh.parameters()),
                                                             tree_flatten(target.parameters())))
    assert [p.name for p in tmp_path.iterdir()] == [chat.CHECKPOINT]


def test_the_verdict_requires_every_short_chat_and_reports_the_agent_sized_prompt():
    ended = [("ok<|im_end|>", True)] * chat.GATED
    cut = ("pw-pw-pw-pw", False)
    assert chat.GATED == 2 * len(chat.CHECK_PROMPTS)
    assert chat.passes(ended + [cut, cut])
    for i in range(chat.GATED):
        assert not chat.passes(ended[:i] + [cut] + ended[i + 1:] + [cut, cut])
    assert not chat.passes([])


def test_the_head_is_scored_against_the_targets_own_next_distribution_at_each_depth():
    """A head that returned exactly the target's hidden state for the token it drafts would draft
    the target's own distribution: its distillation loss is zero at both depths (and an off-by-one
    in the teacher's positions would not be). The real head is not: its loss is positive."""
    import mlx.core as mx

    from devkit.demo.train import SEQ_LEN
    from mtpstack.worker.demo import DEMO_HEAD
    from mtpstack.worker.mtp import load_head

    target = mlx_lm.load(str(DEMO_TARGET))[0]
    text = target.language_model.model
    window = mx.array(np.random.default_rng(0).integers(3, 1000, size=(2, SEQ_LEN + 3)))
    states = text(window[:, : SEQ_LEN + 2])

    class Oracle:
        layers = [None]
        calls = 0

        def __call__(self, embeddings, hidden, cache):
            self.calls += 1
            return states[:, self.calls : SEQ_LEN + self.calls]  # depth d drafts token t+d+1 from h[t+d]

    exact = chat.head_distill_losses(Oracle(), target, window)
    assert all(abs(v.item()) < 1e-4 for v in exact)
    real = chat.head_distill_losses(load_head(DEMO_HEAD, DEMO_TARGET).module, target, window)
    assert all(v.item() > 0.01 for v in real)
