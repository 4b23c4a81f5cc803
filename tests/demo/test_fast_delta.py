"""`devkit.demo.fast_delta`: the gated delta rule in chunks computes what mlx-lm's step-by-step code computes."""

from __future__ import annotations

import pytest

mlx_lm = pytest.importorskip("mlx_lm")
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models.gated_delta import compute_g, gated_delta_ops, normalize_qk  # noqa: E402

from devkit.demo.fast_delta import CHUNK, chunked_gated_delta, chunked_gated_delta_layers  # noqa: E402

pytestmark = pytest.mark.mlx


def inputs(t: int, seed: int = 0, batch: int = 2, hk: int = 2, hv: int = 4, d: int = 16):
    mx.random.seed(seed)
    q, k = normalize_qk(mx.random.normal((batch, t, hk, d)), mx.random.normal((batch, t, hk, d)), inv_scale=d**-0.5,
                        eps=1e-6)
    v = mx.random.normal((batch, t, hv, d))
    a, b = mx.random.normal((batch, t, hv)), mx.random.normal((batch, t, hv))
    a_log, dt_bias = mx.random.normal((hv,)), mx.random.normal((hv,))
    state = 0.1 * mx.random.normal((batch, hv, d, d))
    g = compute_g(a_log, a, dt_bias)
    log_g = -mx.exp(a_log) * nn.softplus(a + dt_bias)
    return q, k, v, g, log_g, mx.sigmoid(b), state


@pytest.mark.parametrize("t", [1, CHUNK - 1, CHUNK, 3 * CHUNK + 5])
def test_chunks_give_the_step_by_step_outputs_and_final_state(t):
    q, k, v, g, log_g, beta, state = inputs(t)
    y1, s1 = gated_delta_ops(q, k, v, g, beta, state)
    y2, s2 = chunked_gated_delta(q, k, v, log_g, beta, state)
    assert y2.shape == y1.shape and s2.shape == s1.shape
    assert mx.abs(y1 - y2).max().item() < 1e-5
    assert mx.abs(s1 - s2).max().item() < 1e-5


def test_chunks_give_the_step_by_step_gradients():
    q, k, v, g, log_g, beta, state = inputs(2 * CHUNK + 9, seed=1)

    def through(f):
        def loss(v, q):
            y, s = f(q, v)
            return (y * y).sum() + s.sum()
        return mx.grad(loss, argnums=(0, 1))(v, q)

    steps = through(lambda q, v: gated_delta_ops(q, k, v, g, beta, state))
    chunks = through(lambda q, v: chunked_gated_delta(q, k, v, log_g, beta, state))
    for a, b in zip(steps, chunks):
        assert mx.abs(a - b).max().item() < 1e-4 * max(1.0, mx.abs(a).max().item())


def test_inside_the_block_the_demo_target_gives_the_logits_it_gives_outside():
    from mtpstack.worker.demo import DEMO_TARGET

    target = mlx_lm.load(str(DEMO_TARGET))[0]
    ids = mx.array([[(i * 37) % 1000 for i in range(300)]])
    plain = target(ids)
    with chunked_gated_delta_layers():
        chunked = target(ids)
    from mlx_lm.models import gated_delta, qwen3_5

    assert qwen3_5.gated_delta_update is gated_delta.gated_delta_update  # put back on leaving
    assert mx.abs(plain - chunked).max().item() < 1e-3
    assert (plain.argmax(-1) == chunked.argmax(-1)).all().item()
