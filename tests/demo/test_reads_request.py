"""`devkit.demo.reads_request`: the probe of how much the demo target's answer depends on the request."""

from __future__ import annotations

import pytest

mlx_lm = pytest.importorskip("mlx_lm")

from devkit.demo import reads_request  # noqa: E402
from mtpstack.worker.demo import DEMO_TARGET  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def target():
    return mlx_lm.load(str(DEMO_TARGET))


def test_one_request_twice_is_the_same_state_and_two_requests_are_not(target):
    model, tokenizer = target
    same, answers = reads_request.probe(model, tokenizer, None, ("say hi", "say hi"), max_tokens=4)
    assert same == pytest.approx(1.0, abs=1e-5) and answers[0] == answers[1]
    other, _ = reads_request.probe(model, tokenizer, "Be brief.", ("say hi", "list the files"), max_tokens=4)
    assert -1.0 <= other < 0.99999


def test_the_command_prints_a_line_per_length(capsys):
    assert reads_request.main(["--models", str(DEMO_TARGET.parent), "--lengths", "0,16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" tokens:")[0].strip() for line in lines] == ["0", "16"]
    assert all("similarity 0." in line or "similarity 1." in line for line in lines)
