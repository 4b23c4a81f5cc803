"""The chunked gated-delta recurrence (worker/gated_delta.py) against mlx-lm's loop of one op a position."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.gated_delta import compute_g, gated_delta_ops

from mtpstack.worker.gated_delta import chunked_recurrence, log_decay


def inputs(rows, length, k_heads=2, v_heads=4, dim=32, seed=0, strong_decay=False):
    mx.random.seed(seed)
    q = mx.random.normal((rows, length, k_heads, dim))
    k = mx.random.normal((rows, length, k_heads, dim))
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * dim**-0.5
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((rows, length, v_heads, dim))
    A_log = mx.random.uniform(0, 4 if strong_decay else 1, (v_heads,))
    dt_bias = mx.random.normal((v_heads,))
    a = mx.random.normal((rows, length, v_heads)) * (40 if strong_decay else 1)
    beta = mx.sigmoid(mx.random.normal((rows, length, v_heads)))
    state = mx.random.normal((rows, v_heads, dim, dim)) * 0.1
    return q, k, v, (A_log, a, dt_bias), beta, state


@pytest.mark.parametrize("length", [1, 5, 64, 65, 200])
@pytest.mark.parametrize("start", ["zeros", "a state"])
def test_equals_the_loop(length, start):
    q, k, v, gate, beta, state = inputs(2, length)
    state = None if start == "zeros" else state
    want_y, want_s = gated_delta_ops(q, k, v, compute_g(*gate), beta, state)
    y, s = chunked_recurrence(q, k, v, log_decay(*gate), beta, state)
    assert y.shape == want_y.shape and s.shape == want_s.shape
    assert mx.allclose(y, want_y, atol=2e-5).item() and mx.allclose(s, want_s, atol=2e-5).item()


def test_padded_positions_leave_the_state_alone_and_rows_are_independent():
    q, k, v, gate, beta, state = inputs(3, 150, seed=1)
    lengths = [150, 97, 3]
    mask = mx.arange(150)[None, :] < mx.array(lengths)[:, None]
    y, s = chunked_recurrence(q, k, v, log_decay(*gate), beta, state, mask)
    A_log, a, dt_bias = gate
    for r, n in enumerate(lengths):
        one = (x[r : r + 1, :n] for x in (q, k, v, compute_g(A_log, a, dt_bias), beta))
        want_y, want_s = gated_delta_ops(*one, state[r : r + 1])
        assert mx.allclose(y[r : r + 1, :n], want_y, atol=2e-5).item(), r
        assert mx.allclose(s[r : r + 1], want_s, atol=2e-5).item(), r


def test_decays_that_underflow_give_no_nan():
    """Decays far below float32's range within one block (log g of -100s): ratios never divide by 0."""
    q, k, v, gate, beta, state = inputs(1, 128, seed=2, strong_decay=True)
    assert (log_decay(*gate) < -100).any().item()  # the case is reached
    y, s = chunked_recurrence(q, k, v, log_decay(*gate), beta, state)
    want_y, want_s = gated_delta_ops(q, k, v, compute_g(*gate), beta, state)
    assert not mx.isnan(y).any().item() and not mx.isnan(s).any().item()
    assert mx.allclose(y, want_y, atol=2e-5).item() and mx.allclose(s, want_s, atol=2e-5).item()


def test_bfloat16_activations_come_back_in_their_dtype_with_a_float32_state():
    q, k, v, gate, beta, state = inputs(1, 70, seed=3)
    y, s = chunked_recurrence(q.astype(mx.bfloat16), k.astype(mx.bfloat16), v.astype(mx.bfloat16), log_decay(*gate), beta, None)
    assert y.dtype == mx.bfloat16 and s.dtype == mx.float32
