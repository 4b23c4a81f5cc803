"""The gated delta rule in chunks, for training the demo target on agent-sized prompts on a CPU.

mlx-lm runs a Qwen3.5 gated-delta layer on the CPU (and in training anywhere) one position at a
time (`gated_delta_ops`): about ten small array operations per position and layer, so a 23k-token
prompt (Claude Code's first turn) costs about a minute on 2 cores, most of it dispatching tiny ops.
`chunked_gated_delta` computes the same recurrence a chunk of positions at a time with matrix
products (the WY form of the delta rule, as flash-linear-attention's `chunk_gated_delta_rule`
does): inside a chunk every position is handled at once, and only the state crosses from chunk to
chunk. The result equals the step-by-step one up to float rounding (tests/demo/test_fast_delta.py),
so a model trained or checked with it behaves as the worker serves it.

`chunked_gated_delta_layers()` swaps it in for mlx-lm's qwen3_5 layers inside a `with` block (for
inputs without a padding mask; anything else still goes to mlx-lm's own code). Only the devkit's
training uses it; the worker is untouched.

The recurrence, per head, with the state S a [Dv, Dk] matrix, decay g_t in (0, 1] and beta_t:

    S_t = g_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,    y_t = S_t q_t

Inside a chunk, with G_i the running product of the decays from its start and S_0 the state
entering it, S_i = G_i S_0 + sum_{j<=i} (G_i / G_j) u_j k_j^T, where the new values u solve
(I + M) U = diag(beta) V - diag(beta G) K S_0^T with M_ij = beta_i (G_i / G_j) k_i.k_j for j < i.
M is strictly lower triangular, so (I + M)^-1 is a finite product of (I + (-M)^(2^n)).
"""

from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

#: Positions handled at once. 64 is flash-linear-attention's choice; the products stay accurate in fp32.
CHUNK = 64
#: Shorter inputs (decoding, short prompts) go to mlx-lm's own code: nothing to gain there.
MIN_POSITIONS = 16


def _unit_lower_inverse(m: mx.array) -> mx.array:
    """(I + m)^-1 for strictly lower-triangular m ([..., C, C]): m is nilpotent, so
    (I + m)^-1 = (I - m)(I + m^2)(I + m^4)... up to m^C = 0."""
    c = m.shape[-1]
    eye = mx.eye(c, dtype=m.dtype)
    p = -m
    inv = eye + p
    span = 2
    while span < c:
        p = p @ p
        inv = inv @ (eye + p)
        span *= 2
    return inv


def chunked_gated_delta(q: mx.array, k: mx.array, v: mx.array, log_g: mx.array, beta: mx.array,
                        state: mx.array, chunk: int = CHUNK) -> tuple[mx.array, mx.array]:
    """`gated_delta_ops`'s result, computed `chunk` positions at a time.

    q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv]; log_g: [B, T, Hv] (the log of the scalar decay);
    beta: [B, T, Hv]; state: [B, Hv, Dv, Dk]. Returns (y [B, T, Hv, Dv], the final state)."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[-2:]
    if hv // hk > 1:
        q, k = mx.repeat(q, hv // hk, -2), mx.repeat(k, hv // hk, -2)
    pad = -t % chunk
    if pad:  # padded positions change nothing: k = v = beta = 0 and no decay
        widths = [(0, 0), (0, pad), (0, 0), (0, 0)]
        q, k, v = (mx.pad(x, widths) for x in (q, k, v))
        log_g, beta = (mx.pad(x, widths[:3]) for x in (log_g, beta))
    n = (t + pad) // chunk
    dtype = q.dtype

    def chunks(x):  # [B, T, H, ...] -> [B, H, N, C, ...]
        x = x.astype(mx.float32).reshape(b, n, chunk, hv, *x.shape[3:])
        return x.transpose(0, 3, 1, 2, *range(4, x.ndim))

    q, k, v, log_g, beta = (chunks(x) for x in (q, k, v, log_g, beta))
    cum = mx.cumsum(log_g, axis=-1)  # [B, H, N, C]: log G_i
    decay = mx.exp(cum)
    lower = mx.tril(mx.ones((chunk, chunk), dtype=mx.bool_))
    # G_i / G_j for j <= i (0 above the diagonal; the exponent is masked first, so it never overflows)
    ratio = mx.where(lower, mx.exp(mx.where(lower, cum[..., :, None] - cum[..., None, :], 0.0)), 0.0)
    kk = k @ k.swapaxes(-1, -2)
    strict = mx.tril(mx.ones((chunk, chunk), dtype=mx.bool_), -1)
    inv = _unit_lower_inverse(mx.where(strict, beta[..., None] * ratio * kk, 0.0))
    u0 = inv @ (beta[..., None] * v)  # [B, H, N, C, Dv]
    w = inv @ ((beta * decay)[..., None] * k)  # [B, H, N, C, Dk]
    qk = (q @ k.swapaxes(-1, -2)) * ratio  # [B, H, N, C, C]
    q_decayed = decay[..., None] * q
    to_end = mx.exp(cum[..., -1:] - cum)[..., None] * k  # (G_C / G_j) k_j
    end = decay[..., -1]  # [B, H, N]

    s = state.astype(mx.float32)  # [B, H, Dv, Dk]
    ys = []
    for i in range(n):
        st = s.swapaxes(-1, -2)  # [B, H, Dk, Dv]
        u = u0[:, :, i] - w[:, :, i] @ st
        ys.append(q_decayed[:, :, i] @ st + qk[:, :, i] @ u)
        s = end[:, :, i, None, None] * s + u.swapaxes(-1, -2) @ to_end[:, :, i]
    y = mx.stack(ys, axis=2).reshape(b, hv, n * chunk, dv)[:, :, :t]
    return y.transpose(0, 2, 1, 3).astype(dtype), s


def gated_delta_update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel=True, lower_bound=None,
                       allow_neg_eigval=False):
    """mlx-lm's `gated_delta_update`, in chunks when that is exactly the same recurrence (no padding
    mask, the plain decay) and worth it (at least MIN_POSITIONS); else mlx-lm's own."""
    from mlx_lm.models import gated_delta

    if mask is not None or lower_bound is not None or q.shape[1] < MIN_POSITIONS:
        return gated_delta.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel,
                                              lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval)
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    # log of mlx-lm's `compute_g`, exp(-exp(A_log) * softplus(a + dt_bias)), without the round trip
    log_g = -mx.exp(A_log.astype(mx.float32)) * nn.softplus(a + dt_bias)
    if state is None:
        state = mx.zeros((q.shape[0], v.shape[-2], v.shape[-1], q.shape[-1]), dtype=mx.float32)
    return chunked_gated_delta(q, k, v, log_g, beta, state)


@contextmanager
def chunked_gated_delta_layers():
    """Inside the block, mlx-lm's qwen3_5 gated-delta layers run `gated_delta_update` above."""
    from mlx_lm.models import qwen3_5

    original = qwen3_5.gated_delta_update
    qwen3_5.gated_delta_update = gated_delta_update
    try:
        yield
    finally:
        qwen3_5.gated_delta_update = original
