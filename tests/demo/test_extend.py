"""`devkit.demo.extend` on the demo pair as `devkit.demo.train` writes it (rebuilt here from the shipped
pair: its trained rows, the plain tokenizer, the trained context): the markers and template added, the
trained rows and greedy text kept, the head's config following; a second run is refused."""

from __future__ import annotations

import json
import shutil

import pytest

mlx_lm = pytest.importorskip("mlx_lm")
import mlx.core as mx  # noqa: E402

from devkit.demo import TOKENIZER_DIR  # noqa: E402
from devkit.demo.bpe import MODEL_MAX_LENGTH, TOKENIZER_FILES, VOCAB_SIZE  # noqa: E402
from devkit.demo.extend import CONTEXT, EMBEDDINGS, ExtendError, extend, main  # noqa: E402
from devkit.demo.family import MARKERS  # noqa: E402
from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET  # noqa: E402

pytestmark = pytest.mark.mlx

TEXTS = ["import os\nimport sys\n\n\ndef main(argv=None):\n    return 0\n",
         "This program is free software; you can redistribute it and/or modify it."]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The shipped pair as training leaves it: 1024 rows, the ChatML tokenizer, context 512."""
    out = tmp_path_factory.mktemp("trained")
    target, head = out / "target", out / "mtp"
    shutil.copytree(DEMO_TARGET, target)
    shutil.copytree(DEMO_HEAD, head)
    weights = mx.load(str(target / "model.safetensors"))
    weights[EMBEDDINGS] = weights[EMBEDDINGS][:VOCAB_SIZE]
    mx.save_safetensors(str(target / "model.safetensors"), weights, metadata={"format": "mlx"})
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, target / name)
    for path in (target / "config.json", head / "config.json"):
        config = json.loads(path.read_text())
        config["text_config"].update(vocab_size=VOCAB_SIZE, max_position_embeddings=MODEL_MAX_LENGTH)
        path.write_text(json.dumps(config))
    return out


def test_extending_adds_the_markers_and_keeps_the_trained_rows_and_text(trained):
    before = mx.load(str(trained / "target" / "model.safetensors"))
    mx.eval(before)
    done = extend(trained, texts=TEXTS)
    assert done["vocab_size"] == VOCAB_SIZE + len(MARKERS) and done["margin"] > 0 and done["greedy_tokens"] > 0
    after = mx.load(str(trained / "target" / "model.safetensors"))
    rows = after[EMBEDDINGS]
    assert rows.shape[0] == VOCAB_SIZE + len(MARKERS)
    assert mx.array_equal(rows[:VOCAB_SIZE], before[EMBEDDINGS])
    assert all(mx.array_equal(after[k], v) for k, v in before.items() if k != EMBEDDINGS)
    # Each marker its own input (distinct rows), none near zero.
    norms = mx.linalg.norm(rows[VOCAB_SIZE:], axis=-1)
    assert norms.min().item() > 0.5 * mx.linalg.norm(rows[:VOCAB_SIZE], axis=-1).min().item()
    assert len({tuple(r) for r in rows[VOCAB_SIZE:].tolist()}) == len(MARKERS)
    target = json.loads((trained / "target" / "config.json").read_text())["text_config"]
    head = json.loads((trained / "mtp" / "config.json").read_text())["text_config"]
    assert target["vocab_size"] == head["vocab_size"] == VOCAB_SIZE + len(MARKERS)
    assert target["max_position_embeddings"] == head["max_position_embeddings"] == CONTEXT
    _, tokenizer = mlx_lm.load(str(trained / "target"))
    assert tokenizer.has_tool_calling and tokenizer.has_thinking


def test_a_pair_extended_already_is_refused_with_the_fix(trained, capsys):
    with pytest.raises(ExtendError, match="extended already"):
        extend(DEMO_TARGET.parent, texts=TEXTS)
    assert main(["--models", str(DEMO_TARGET.parent)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "\n\nhint: extend the pair as `python -m devkit.demo.train`" in err
