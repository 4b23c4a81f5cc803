"""A long prompt's attention on the CPU, its query rows split over the cores.

mlx runs each op of a stream on one thread. On the CPU, a prompt chunk's attention is mostly the
softmax over its chunk x context scores (`exp` over 16M entries for a 512-token chunk at 8k
context), and that runs on one core while the others wait: on the widened demo target at 8k it
was half the prefill's time, and its share grows with the context. Each query row's attention is
independent of the others', so the chunk's rows are split into one slice per core, each run on
its own CPU stream, and joined: the same arithmetic per row, the cores busy together.

Only where it pays: the CPU device, at least `MIN_ROWS` query rows per stream (a decode step's
few positions take mlx's own path), no quantized cache and no attention sinks. A causal slice
attends to the keys up to its last row (`mask="causal"` aligns a slice's rows to the end of the
keys it is given); a mask array is sliced by rows. On a GPU nothing changes: mlx's fused kernel
already uses the whole device.

`install(model)` points the target's attention modules at `attention` (once per mlx-lm module:
the function those modules import from `mlx_lm.models.base`); `attention` hands every case it
does not split to that function, so plain use is unchanged.
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
from mlx_lm.models import base

#: The fewest query rows a stream's slice gets: below this, the split costs more than it saves.
MIN_ROWS = 64
#: The most streams a chunk is split over (each slice's matmuls still use the BLAS threads).
MAX_STREAMS = 4

_streams: list = []


def cores() -> int:
    """The cores this process may run on (its affinity, as a container or `taskset` limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def streams() -> list:
    """The CPU streams a chunk's slices run on, made once."""
    if not _streams:
        _streams.extend(mx.new_stream(mx.cpu) for _ in range(max(1, min(cores(), MAX_STREAMS))))
    return _streams


def _splits(queries: mx.array, cache, mask, sinks) -> int:
    if sinks is not None or hasattr(cache, "bits") or mx.default_device().type != mx.DeviceType.cpu:
        return 1
    if not (mask is None or isinstance(mask, mx.array) or mask == "causal"):
        return 1
    return max(1, min(len(streams()), queries.shape[2] // MIN_ROWS))


def attention(queries, keys, values, cache, scale: float, mask, sinks=None) -> mx.array:
    """`mlx_lm.models.base.scaled_dot_product_attention`, with a long chunk's query rows split over the
    CPU's cores (queries [B, heads, n, d]; keys and values [B, kv heads, S, d])."""
    parts = _splits(queries, cache, mask, sinks)
    if parts == 1:
        return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
    n, span = queries.shape[2], keys.shape[2]
    bounds = [n * i // parts for i in range(parts + 1)]
    outs = []
    for stream, start, end in zip(streams(), bounds, bounds[1:]):
        with mx.stream(stream):
            q = queries[:, :, start:end]
            if isinstance(mask, str):  # causal: this slice's last row sees the keys up to its own position
                seen = span - (n - end)
                outs.append(mx.fast.scaled_dot_product_attention(q, keys[:, :, :seen], values[:, :, :seen], scale=scale, mask=mask))
                continue
            rows = mask if mask is None or mask.ndim < 2 or mask.shape[-2] == 1 else mask[..., start:end, :]
            outs.append(mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=rows))
    return mx.concatenate(outs, axis=2)


def install(model) -> int:
    """Point the attention of `model`'s layers at `attention`; returns how many mlx-lm modules now do."""
    layers = getattr(getattr(model, "language_model", model), "layers", None) or []
    modules = {type(attn).__module__ for layer in layers if (attn := getattr(layer, "self_attn", None)) is not None}
    patched = 0
    for name in sorted(modules):
        module = sys.modules.get(name)
        current = getattr(module, "scaled_dot_product_attention", None)
        if current is base.scaled_dot_product_attention:
            module.scaled_dot_product_attention = attention
        if getattr(module, "scaled_dot_product_attention", None) is attention:
            patched += 1
    return patched
