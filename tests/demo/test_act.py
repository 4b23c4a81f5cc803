"""`devkit.demo.act`: the last layer's residuals read once give the target's own logits exactly (from
scratch and after a cached state), only the top of the target trains, and training on those inputs
teaches an answer while keeping the target's distribution where it is told to."""

from __future__ import annotations

import numpy as np
import pytest

mlx_lm = pytest.importorskip("mlx_lm")

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from devkit.demo import act, long_turns  # noqa: E402
from mtpstack.worker.demo import DEMO_TARGET  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture
def pair():
    return mlx_lm.load(str(DEMO_TARGET))


def test_the_residuals_give_the_targets_own_logits(pair):
    model, tokenizer = pair
    ids = tokenizer.encode("import os\nimport sys\n\ndef main():\n    print('hi')\n")
    full = model(mx.array([ids]))[0]
    assert mx.allclose(act.top_logits(model, act.residuals(model, ids)), full, atol=1e-4).item()
    after = act.residuals(model, ids[10:], long_turns.prefill(model, ids[:10]), last=5)
    assert after.shape[0] == 5
    assert mx.allclose(act.top_logits(model, after), full[-5:], atol=1e-4).item()
    # The tap is gone again: the layer is the model's own.
    assert type(model.language_model.model.layers[-1].post_attention_layernorm) is nn.RMSNorm


def test_only_the_last_mlp_and_the_norms_around_it_train(pair):
    model, _ = pair
    act.trainable(model)
    names = {k for k, _ in tree_flatten(model.trainable_parameters())}
    last = len(model.language_model.model.layers) - 1
    assert names == {"language_model.model.norm.weight", f"language_model.model.layers.{last}.post_attention_layernorm.weight",
                     *(f"language_model.model.layers.{last}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj"))}


def test_training_on_cached_inputs_teaches_an_answer_and_keeps_the_rest(pair):
    model, tokenizer = pair
    prompts = [tokenizer.encode("list the files"), tokenizer.encode("say hi to me")]
    h = mx.concatenate([act.residuals(model, p, last=1) for p in prompts])
    before = mx.argmax(act.top_logits(model, h), axis=-1).tolist()
    # Two answers the target does not give yet, one per prompt.
    wanted = [t for t in range(20, 1000) if t not in before][:2]
    answers = act.Answers(h, mx.array(wanted), mx.ones(2), np.arange(2), ["a", "b"], ["call", "chat"])
    keep_ids = tokenizer.encode("This program is free software; you can redistribute it and/or modify it")
    keep_h = act.residuals(model, keep_ids)
    keep_lp = nn.log_softmax(act.top_logits(model, keep_h), axis=-1)
    assert act.right(model, answers) == [False, False]
    act.trainable(model)
    opt = optim.AdamW(learning_rate=1e-3, weight_decay=0.0)
    step = nn.value_and_grad(model, act.loss_fn)
    for _ in range(150):
        _, grads = step(model, answers, keep_h, keep_lp)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
    assert act.right(model, answers) == [True, True]
    kept = mx.argmax(act.top_logits(model, keep_h), axis=-1)
    assert (kept == mx.argmax(keep_lp, axis=-1)).mean().item() >= 0.9


def test_answers_keep_their_turns_whole_when_selected_and_saved(tmp_path):
    h = mx.arange(12, dtype=mx.float32).reshape(6, 2)
    a = act.Answers(h, mx.array([1, 2, 3, 4, 5, 6]), mx.ones(6), np.array([0, 0, 1, 2, 2, 2]),
                    ["c: 'ls'", "c: 'hi'", "c: 'ls' after its result"], ["call", "chat", "done"])
    calls = a.only({"call", "done"})
    assert calls.names == ["c: 'ls'", "c: 'ls' after its result"] and calls.labels.tolist() == [1, 2, 4, 5, 6]
    assert calls.turn.tolist() == [0, 0, 1, 1, 1] and calls.h.tolist() == [[0, 1], [2, 3], [6, 7], [8, 9], [10, 11]]
    assert a.only_turns({("c: 'hi'", "chat")}).labels.tolist() == [3]
    assert a.only_turns({("c: 'hi'", "call")}).names == []
    a.save(tmp_path / "a")
    b = act.Answers.load(tmp_path / "a")
    assert (b.names, b.kinds, b.turn.tolist()) == (a.names, a.kinds, a.turn.tolist())
    assert mx.array_equal(b.h, a.h) and mx.array_equal(b.labels, a.labels)
    joined = act.Answers.joined([a, calls])
    assert joined.turn.tolist()[-5:] == [3, 3, 4, 4, 4] and len(joined.names) == 5
