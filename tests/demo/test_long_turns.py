"""`devkit.demo.long_turns`: an episode learned in parts (a cached system part, a constant part spliced
after the request) has the loss of one pass over each whole turn, and greedy answers from a cached
state are mlx-lm's."""

from __future__ import annotations

import pytest

mlx_lm = pytest.importorskip("mlx_lm")
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.generate import stream_generate  # noqa: E402

from devkit.demo import long_turns  # noqa: E402
from devkit.demo.agent_turns import Episode, Turn  # noqa: E402
from devkit.demo.fast_delta import chunked_gated_delta_layers  # noqa: E402
from mtpstack.worker.demo import DEMO_TARGET  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def target():
    return mlx_lm.load(str(DEMO_TARGET))


def tokens(n: int, seed: int) -> list[int]:
    mx.random.seed(seed)
    return mx.random.randint(0, 1000, (n,)).tolist()


def episode(ids: list[int], system: int, request: int) -> Episode:
    """A shared prompt of 900 tokens, one turn answered at once and one with more prompt first."""
    shared = ids[:900]
    return Episode("test", 0, shared, system, request,
                   [Turn(shared + ids[900:905], ids[905:925], True), Turn(shared + ids[925:990], ids[990:1000], False)])


def weights(turn, n_prompt):
    return [0.25] * n_prompt + [1.0] * len(turn.answer)


def whole_turns_loss(model, ep: Episode, start: int, prepared) -> float:
    total = weight = 0.0
    for turn, (_, w) in zip(ep.turns, prepared.tails):
        full = mx.array([turn.prompt + turn.answer])
        losses = nn.losses.cross_entropy(model(full[:, :-1]), full[:, 1:], reduction="none")[0, start:]
        total += (losses * mx.array(w[1:])).sum().item()
        weight += sum(w[1:])
    return total / weight


@pytest.mark.parametrize("request_at", [300, 860])
def test_the_loss_in_parts_is_the_loss_of_one_pass_over_each_turn(target, monkeypatch, request_at):
    model, _ = target
    monkeypatch.setattr(long_turns, "SPLICE_GAP", 256)
    ep = episode(tokens(1000, 0), 200, request_at)
    with chunked_gated_delta_layers():
        ctx = long_turns.Context(long_turns.prefill(model, ep.shared[: ep.system]))
        prepared = long_turns.prepare(model, ep, ctx, weights)
        # A request far from the end is run again with gradients and the rest spliced; a near one is not.
        spliced = request_at < 900 - long_turns.TAIL - long_turns.SPLICE_GAP
        assert (prepared.splice is not None) == spliced and bool(prepared.request) == spliced
        start = ep.system + len(prepared.request) + (len(prepared.splice.tokens) if spliced else 0)
        parts = long_turns.loss(model, prepared).item()
        assert parts == pytest.approx(whole_turns_loss(model, ep, start, prepared), rel=1e-4)
        value, grads = nn.value_and_grad(model, long_turns.loss)(model, prepared)
        mx.eval(value, grads)
        assert value.item() == pytest.approx(parts)


def test_a_contexts_splice_is_reused_only_for_the_same_tokens(target, monkeypatch):
    model, _ = target
    monkeypatch.setattr(long_turns, "SPLICE_GAP", 256)
    ids = tokens(1000, 1)
    own = episode(ids, 200, 300)
    with chunked_gated_delta_layers():
        ctx = long_turns.context(model, own.shared[: own.system], own)
        assert ctx.splice is not None
        # Another request of the same length before the same constant part: the context's splice.
        other = episode(ids[:250] + tokens(50, 2) + ids[300:], 200, 300)
        assert long_turns.prepare(model, other, ctx, weights).splice is ctx.splice
        # A different constant part: computed for the episode.
        changed = episode(ids[:600] + tokens(50, 3) + ids[650:], 200, 300)
        assert long_turns.prepare(model, changed, ctx, weights).splice is not ctx.splice


def test_greedy_from_a_cached_state_answers_as_mlx_lm_does_from_the_whole_prompt(target):
    model, tokenizer = target
    prompt = tokenizer.encode("import os\nimport sys\n\n\ndef main():\n    for name in sorted(os.listdir('.')):\n")
    stop = set(tokenizer.eos_token_ids)
    with chunked_gated_delta_layers():
        state = long_turns.prefill(model, prompt[:10])
        ours = long_turns.greedy(model, state, prompt[10:], max_tokens=24, stop=stop)
    theirs = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=24)]
    assert ours == theirs


def test_an_agent_step_is_the_mean_of_its_episodes_losses_and_windows_are_not_episodes(target):
    from devkit.demo import chat

    model, _ = target
    eps = [episode(tokens(1000, seed), 200, 860) for seed in (1, 2)]
    with chunked_gated_delta_layers():
        # Each episode on its own system part (their tokens differ), as AgentTurns prepares them.
        prepared = tuple(long_turns.prepare(model, ep, long_turns.Context(long_turns.prefill(model, ep.shared[:200])),
                                            weights) for ep in eps)
        each = [long_turns.loss(model, p).item() for p in prepared]
        step = chat.step_loss(model, prepared).item()
    assert each[0] != pytest.approx(each[1])
    assert step == pytest.approx(sum(each) / 2, rel=1e-5)
    window = (mx.array([tokens(65, 3)]), mx.ones((1, 65)))
    assert chat.is_agent(prepared) and not chat.is_agent(window)
    assert chat.step_loss(model, window).item() == pytest.approx(chat.weighted_loss(model, window).item())
