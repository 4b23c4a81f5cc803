"""The committed demo pair loads, fits the size budget, and its drafter is a useful draft model."""

import json

import pytest

mlx_lm = pytest.importorskip("mlx_lm")
from mlx_lm.generate import stream_generate  # noqa: E402

from worker.demo import DEMO_DRAFTER, DEMO_TARGET  # noqa: E402

pytestmark = pytest.mark.mlx

if not (DEMO_TARGET / "model.safetensors").is_file():
    pytest.skip("the demo models are not in this checkout", allow_module_level=True)


@pytest.fixture(scope="module")
def demo():
    target, tokenizer = mlx_lm.load(str(DEMO_TARGET))
    drafter, _ = mlx_lm.load(str(DEMO_DRAFTER))
    return target, drafter, tokenizer


def test_demo_pair_fits_in_20_mb():
    total = sum(p.stat().st_size for d in (DEMO_TARGET, DEMO_DRAFTER) for p in d.iterdir())
    assert total <= 20 * 1024 * 1024


def test_demo_drafter_is_a_one_layer_qwen3_with_the_target_tokenizer():
    target = json.loads((DEMO_TARGET / "config.json").read_text())
    drafter = json.loads((DEMO_DRAFTER / "config.json").read_text())
    assert target["model_type"] == drafter["model_type"] == "qwen3"
    assert drafter["num_hidden_layers"] == 1 < target["num_hidden_layers"]
    assert target["vocab_size"] == drafter["vocab_size"]
    assert (DEMO_TARGET / "tokenizer.json").read_bytes() == (DEMO_DRAFTER / "tokenizer.json").read_bytes()


SAMPLE = (
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n        argv = sys.argv[1:]\n"
    "    for name in argv:\n        print(os.path.basename(name))\n    return 0\n\n"
    "This program is free software; you can redistribute it and/or modify it under the terms of the "
    "GNU General Public License as published by the Free Software Foundation.\n"
)


def mean_cross_entropy(model, tokenizer, text):
    import mlx.core as mx
    import mlx.nn as nn

    ids = mx.array([tokenizer.encode(text)])
    logits = model(ids[:, :-1])
    return nn.losses.cross_entropy(logits, ids[:, 1:], reduction="mean").item()


def test_demo_models_predict_code_and_prose_far_better_than_chance(demo):
    import math

    target, drafter, tokenizer = demo
    chance = math.log(len(tokenizer.vocab))
    for model in (target, drafter):
        # Random weights score about ln(1024) = 6.9 nats or worse; the trained pair about 3.2-3.7.
        assert mean_cross_entropy(model, tokenizer, SAMPLE) < chance - 2.0


def test_demo_drafter_is_accepted_often_and_never_changes_greedy_text(demo):
    target, drafter, tokenizer = demo
    prompt = "This program is free software; you can redistribute it"
    plain = [r.token for r in stream_generate(target, tokenizer, prompt, max_tokens=64)]
    spec = list(stream_generate(target, tokenizer, prompt, max_tokens=64, draft_model=drafter, num_draft_tokens=3))
    assert [r.token for r in spec] == plain
    assert sum(r.from_draft for r in spec) / len(spec) >= 0.25
