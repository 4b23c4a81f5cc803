"""The gated-delta recurrence over a prompt chunk, in chunks of positions: matrix products, not a loop a position.

mlx-lm runs a gated-delta layer's recurrence as one Metal kernel on Apple GPUs and, everywhere
else, as a loop of one compiled op per position (`gated_delta_ops`): on the CPU that loop was a
third of a long prompt's prefill (profiled on the widened demo target, 14 layers, 8k tokens). The
recurrence (per value head, state `S` of shape [Dv, Dk], decay `g_t`, write strength `beta_t`):

    S_t = g_t S_{t-1} + beta_t (v_t - g_t S_{t-1} k_t) k_t^T,    y_t = S_t q_t

is linear in `S_0` within a block of C positions, so a block's outputs and final state come from a
few C x C and C x D products (the WY form of the delta rule, as the gated-delta paper's chunked
algorithm computes it). With `gamma_t` the decay accumulated since the block began and `delta_i` the
value written at i:

    delta = (I + A)^-1 diag(beta) (V - diag(gamma) K S_0^T),   A_ti = beta_t (gamma_t / gamma_i) k_t.k_i  (i < t)
    Y     = diag(gamma) Q S_0^T + (M o Q K^T) delta,            M_ti = gamma_t / gamma_i                   (i <= t)
    S_C   = gamma_C S_0 + delta^T diag(gamma_C / gamma) K

Decays are kept as logarithms (computed from the layer's own parameters, never `log(g)`), and every
ratio is one `exp` of a sum of log-decays over the positions between (at most 0), so no decay
underflows into a 0/0 and strong decays lose no precision to cancellation.
`(I + A)^-1` is the product of `I + (-A)^(2^j)`, exact for a strictly lower triangular A. Padded
positions of right-padded rows decay by 1 and write nothing, so they leave the state as it was.

The result equals the loop's up to float rounding (about 1e-7 relative in float32, tested against
mlx-lm's loop in tests/worker/test_gated_delta.py); the computation runs in float32 whatever the
activations' dtype, as the loop's state does.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import normalize_qk

#: Positions per block of the chunked recurrence: the C of the C x C products.
BLOCK = 64


def log_decay(A_log: mx.array, a: mx.array, dt_bias: mx.array) -> mx.array:
    """log g, for mlx-lm's `compute_g(A_log, a, dt_bias) = exp(-exp(A_log) * softplus(a + dt_bias))`."""
    return -mx.exp(A_log.astype(mx.float32)) * nn.softplus((a + dt_bias).astype(mx.float32))


def _inverse_unit_lower(a: mx.array) -> mx.array:
    """(I + a)^-1 for strictly lower triangular `a` [..., C, C]: the product of (I + (-a)^(2^j))."""
    size = a.shape[-1]
    power = -a
    inverse = mx.eye(size, dtype=a.dtype) + power
    span = 2
    while span < size:
        power = power @ power
        inverse = inverse + inverse @ power
        span *= 2
    return inverse


def chunked_recurrence(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    log_g: mx.array,
    beta: mx.array,
    state: mx.array | None,
    mask: mx.array | None = None,
    block: int = BLOCK,
) -> tuple[mx.array, mx.array]:
    """The gated-delta recurrence over T positions: outputs [B, T, Hv, Dv] and the final state [B, Hv, Dv, Dk].

    q, k: [B, T, Hk, Dk] (normalised as mlx-lm's layer does); v: [B, T, Hv, Dv]; log_g, beta: [B, T, Hv]
    (scalar gates); state: [B, Hv, Dv, Dk] or None (zeros); mask: [B, T], False at padded positions."""
    rows, length, k_heads, k_dim = q.shape
    v_heads, v_dim = v.shape[-2:]
    out_dtype = q.dtype
    if (repeat := v_heads // k_heads) > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    log_g, beta = log_g.astype(mx.float32), beta.astype(mx.float32)
    if mask is not None:
        keep = mask[..., None]
        log_g, beta = mx.where(keep, log_g, 0.0), mx.where(keep, beta, 0.0)
    pad = (-length) % block
    if pad:
        def padded(x):
            return mx.concatenate([x, mx.zeros((rows, pad) + x.shape[2:], x.dtype)], axis=1)

        q, k, v, log_g, beta = (padded(x) for x in (q, k, v, log_g, beta))  # log g = 0 and beta = 0: no change
    blocks = (length + pad) // block

    def heads_first(x):  # [B, T, H, ...] -> [B, H, blocks, C, ...]
        return x.reshape(rows, blocks, block, v_heads, -1).transpose(0, 3, 1, 2, 4).astype(mx.float32)

    Q, K, V = heads_first(q), heads_first(k), heads_first(v)
    lg = heads_first(log_g)[..., 0]  # [B, H, blocks, C]
    cum = mx.cumsum(lg, axis=-1)  # log gamma_t
    b = heads_first(beta)[..., 0]
    causal = mx.tril(mx.ones((block, block), dtype=mx.bool_))
    below = mx.tril(mx.ones((block, block), dtype=mx.bool_), -1)
    # log(gamma_t / gamma_i) = the sum of log g over i < j <= t, summed as such: a difference of two
    # prefix sums would cancel catastrophically where the decays are strong.
    gap = mx.cumsum(mx.where(below, lg[..., :, None], 0.0), axis=-2)
    decay = mx.where(causal, mx.exp(mx.where(causal, gap, 0.0)), 0.0)
    inverse = _inverse_unit_lower(mx.where(below, decay * (K @ K.swapaxes(-1, -2)), 0.0) * b[..., :, None])
    attend = decay * (Q @ K.swapaxes(-1, -2))  # M o Q K^T (decay is 0 above the diagonal)
    gamma = mx.exp(cum)[..., None]
    to_end = decay[..., -1, :, None] * K  # diag(gamma_C / gamma) K
    gamma_end = mx.exp(cum[..., -1])[..., None, None]
    S = mx.zeros((rows, v_heads, v_dim, k_dim), mx.float32) if state is None else state.astype(mx.float32)
    outs = []
    for c in range(blocks):
        read = S.swapaxes(-1, -2)  # [B, H, Dk, Dv]
        delta = inverse[:, :, c] @ (b[:, :, c, :, None] * (V[:, :, c] - gamma[:, :, c] * (K[:, :, c] @ read)))
        outs.append(gamma[:, :, c] * (Q[:, :, c] @ read) + attend[:, :, c] @ delta)
        S = gamma_end[:, :, c] * S + delta.swapaxes(-1, -2) @ to_end[:, :, c]
    y = mx.stack(outs, axis=2).reshape(rows, v_heads, blocks * block, v_dim).transpose(0, 2, 1, 3)
    return y[:, :length].astype(out_dtype), S


def conv_input(layer, cache, qkv: mx.array) -> mx.array:
    """The conv's input: the row's window before this forward (zeros at its start), then `qkv`."""
    window = cache[0]
    if window is None:
        window = mx.zeros((qkv.shape[0], layer.conv_kernel_size - 1, layer.conv_dim), dtype=qkv.dtype)
    return mx.concatenate([window, qkv], axis=1)


def conv_qkv(layer, conv_in: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """q, k (normalised as mlx-lm's layer does) and v from the conv over `conv_in`."""
    rows, n = conv_in.shape[0], conv_in.shape[1] - (layer.conv_kernel_size - 1)
    conv_out = nn.silu(layer.conv1d(conv_in))
    q, k, v = [
        t.reshape(rows, n, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [layer.key_dim, 2 * layer.key_dim], -1),
            [layer.num_k_heads, layer.num_k_heads, layer.num_v_heads],
            [layer.head_k_dim, layer.head_k_dim, layer.head_v_dim],
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=layer.head_k_dim**-0.5, eps=1e-6)
    return q, k, v


def prefill_call(layer, inputs: mx.array, mask: mx.array | None, cache) -> mx.array:
    """A gated-delta layer's prompt forward with the chunked recurrence: mlx-lm's layer step for step
    (the family's input projections, `layer._project`; padded positions zeroed before the conv; the
    conv window taken at each row's last real position when the cache carries `lengths`), with
    `chunked_recurrence` in place of its loop of one op a position."""
    rows, n, _ = inputs.shape
    qkv, z, b, a = layer._project(layer, inputs)
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    conv_in = conv_input(layer, cache, qkv)
    tail = layer.conv_kernel_size - 1
    if cache.lengths is not None:
        ends = mx.clip(cache.lengths, 0, n)
        cache[0] = mx.take_along_axis(conv_in, (ends[:, None] + mx.arange(tail))[..., None], axis=1)
    else:
        cache[0] = mx.contiguous(conv_in[:, -tail:, :])
    q, k, v = conv_qkv(layer, conv_in)
    out, cache[1] = chunked_recurrence(q, k, v, log_decay(layer.A_log, a, layer.dt_bias), mx.sigmoid(b), cache[1], mask)
    cache.advance(n)
    out = layer.norm(out, z)
    return layer.out_proj(out.reshape(rows, n, -1))
