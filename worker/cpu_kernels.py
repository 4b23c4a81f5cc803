"""A prompt chunk's heaviest CPU ops in numpy: its attention, and its MLPs' SwiGLU.

mlx's CPU backend computes `exp` one entry at a time: 13.7 ns an entry on the 2-core x86_64 machine,
with errors of up to 26 ulp; numpy's is vectorized (AVX2 / AVX-512 / NEON): 0.9 ns, within 2.5
ulp. A prompt chunk's forward is full of it. Its attention is mostly the softmax over the chunk x
context scores (16M entries for a 512-token chunk at 8k context, 7 layers of the widened demo
target): one such attention took 258 ms in mlx (170 ms split by query rows over two CPU streams)
and 59 ms here, nearer float64's result than mlx's own (6.8e-8 against 2.3e-7 off). Its MLPs'
SwiGLU (`silu(gate) * up` over the chunk x intermediate width, 3.1M entries a layer there) took
51 ms a layer, 5.7 ms here.

So on the CPU, for a prompt chunk:
- `attention`: at least `MIN_ROWS` query rows: the scores with numpy's BLAS, the mask, the softmax
  in place (max, subtract, `exp`, sum) and the values' product divided by the sums, in blocks of
  query rows that bound the scores' memory (`BLOCK_ENTRIES`); the causal mask skips the keys a
  block cannot see;
- `swiglu`: at least `MIN_ENTRIES` entries.
Half-precision inputs are computed in float32 and the output cast back. Everything else takes
mlx-lm's own path: a decode step's few positions, a quantized cache, attention sinks, and any GPU
(mlx's fused kernels already use the whole device).

`install(model)` points the modules of the target's attention and MLP layers at these (once per
mlx-lm module: the functions those modules import from `mlx_lm.models.base` and `.activations`);
each hands every case it does not take to that function, so plain use is unchanged.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import mlx.core as mx
import numpy as np
from mlx_lm.models import activations, base

#: The fewest query rows computed here: a decode step's few positions take mlx's own path (numpy's
#: is no faster there; a 32-token chunk at 7k context is, 175 ms against 248).
MIN_ROWS = 16
#: The fewest entries a SwiGLU computed here has: a narrow decode step's take mlx's own path.
MIN_ENTRIES = 1 << 16
#: The most threads a chunk's blocks of query rows run on.
MAX_THREADS = 4
#: The most score entries one block of query rows holds at once (float32: 4 bytes each), so a
#: 30k-token context's scores stay tens of MB however long the chunk.
BLOCK_ENTRIES = 1 << 23
DTYPES = {mx.float32, mx.float16, mx.bfloat16}


#: The threads a chunk's blocks of query rows run on, made at the first such chunk (`_pool`).
_POOL: ThreadPoolExecutor | None = None


def cores() -> int:
    """The cores this process may run on (its affinity, as a container or `taskset` limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads() -> int:
    return max(1, min(cores(), MAX_THREADS))


def _pool() -> ThreadPoolExecutor:
    """The threads a chunk's blocks run on, made once, with numpy's own BLAS held to one thread first."""
    global _POOL
    if _POOL is None:
        one_thread_numpy_blas()
        _POOL = ThreadPoolExecutor(_threads(), thread_name_prefix="cpu-kernels")
    return _POOL


def one_thread_numpy_blas() -> str | None:
    """Hold numpy's bundled OpenBLAS (pip's numpy: `scipy_openblas`) to one thread; returns its path, or
    None where numpy has none of its own (Accelerate, or the system BLAS mlx shares). Its threads and
    mlx's BLAS's, each spinning after its work, fought over the cores: a decode step's attention here
    took 8.4 ms a layer against 0.4 alone, its step 308 ms against 103; held to one thread, 69 ms."""
    folder = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "libscipy_openblas*.so*"))):
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads"):
            if hasattr(lib, name):
                getattr(lib, name)(1)
                return path
    return None


def _on_cpu() -> bool:
    return mx.default_device().type == mx.DeviceType.cpu


def _float32(x: mx.array) -> np.ndarray:
    return np.asarray(x if x.dtype == mx.float32 else x.astype(mx.float32))


def _takes(queries: mx.array, cache, mask, sinks) -> bool:
    if sinks is not None or hasattr(cache, "bits") or not _on_cpu():
        return False
    if not (mask is None or isinstance(mask, mx.array) or mask == "causal"):
        return False
    return queries.shape[2] >= MIN_ROWS and queries.dtype in DTYPES


def attention(queries, keys, values, cache, scale: float, mask, sinks=None) -> mx.array:
    """`mlx_lm.models.base.scaled_dot_product_attention`, with a long chunk's attention computed in numpy on the
    CPU (queries [B, heads, n, d]; keys and values [B, kv heads, S, d]; mask None, "causal" (a
    query row sees the keys up to its own position, counted from the end), a boolean array (True:
    seen) or an additive one, broadcast to [B, heads, n, S])."""
    if not _takes(queries, cache, mask, sinks):
        return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
    dtype, pool = queries.dtype, _pool()  # the pool first: numpy's BLAS one thread before its first product
    q, k, v = (_float32(x) for x in (queries, keys, values))
    causal, m = isinstance(mask, str), None
    if isinstance(mask, mx.array):
        m = np.asarray(mask if mask.dtype in (mx.bool_, mx.float32) else mask.astype(mx.float32))
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # [B or 1, heads or 1, n or 1, S]
    out = np.empty(q.shape, np.float32)
    for b in range(q.shape[0]):
        mb = None if m is None else m[b if m.shape[0] > 1 else 0]
        out[b] = _one_row(pool, q[b] * np.float32(scale), k[b], v[b], causal, mb)
    got = mx.array(out)
    return got if dtype == mx.float32 else got.astype(dtype)


def _one_row(pool: ThreadPoolExecutor, q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, mask: np.ndarray | None) -> np.ndarray:
    """One batch row: q [heads, n, d] (scaled), k and v [kv heads, S, d], mask [1 or heads, 1 or n, S]. Its
    blocks of query rows run on the pool's threads (numpy lets go of the GIL), one core each."""
    heads, n, d = q.shape
    kv, span = k.shape[0], k.shape[1]
    rep = heads // kv  # query head h reads kv head h // rep, as mlx's attention groups them
    q = q.reshape(kv, rep, n, d)
    if mask is not None:
        mask = mask.reshape(*((kv, rep) if mask.shape[0] == heads else (1, 1)), *mask.shape[1:])
    out = np.empty((kv, rep, n, d), np.float32)
    rows = max(1, min(BLOCK_ENTRIES // (heads * span), -(-n // _threads())))  # every core a block
    blocks = [(start, min(n, start + rows)) for start in range(0, n, rows)]
    block = partial(_block, q, k.transpose(0, 2, 1), v, causal, mask, out)
    if len(blocks) == 1:
        block(*blocks[0])
    else:
        list(pool.map(lambda b: block(*b), blocks))
    return out.reshape(heads, n, d)


def _block(q, kt, v, causal: bool, mask, out, start: int, end: int) -> None:
    """Query rows `start:end` of one batch row into `out` (q [kv, rep, n, d], kt [kv, d, S], v [kv, S, d])."""
    kv, rep, n, d = q.shape
    span = kt.shape[2]
    seen = span - (n - end) if causal else span  # the keys this block's last row sees
    scores = np.matmul(q[:, :, start:end].reshape(kv, rep * (end - start), d), kt[:, :, :seen])
    scores = scores.reshape(kv, rep, end - start, seen)
    if causal:  # row i sees keys up to span - n + i: only the block's last columns are masked
        first = span - n + start
        band = np.arange(first, seen)[None, :] > np.arange(first, first + end - start)[:, None]
        np.copyto(scores[..., first:seen], -np.inf, where=band)
    elif mask is not None:
        rows = mask[..., start:end, :] if mask.shape[-2] > 1 else mask
        if rows.dtype == np.bool_:
            np.copyto(scores, -np.inf, where=~rows)
        else:
            scores += rows
    top = scores.max(axis=-1, keepdims=True)
    np.subtract(scores, top, out=scores)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    part = np.matmul(scores.reshape(kv, rep * (end - start), seen), v[:, :seen])
    out[:, :, start:end] = part.reshape(kv, rep, end - start, d) / total


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """`mlx_lm.models.activations.swiglu` (`silu(gate) * x`), a prompt chunk's computed in numpy on the CPU."""
    if gate.size < MIN_ENTRIES or gate.dtype not in DTYPES or gate.shape != x.shape or not _on_cpu():
        return activations.swiglu(gate, x)
    g, up = _float32(gate), _float32(x)
    out = np.negative(g)
    with np.errstate(over="ignore"):  # exp(-gate) past float32's range is inf, and silu there 0: right
        np.exp(out, out=out)
    out += 1
    np.divide(g, out, out=out)
    out *= up
    got = mx.array(out)
    return got if gate.dtype == mx.float32 else got.astype(gate.dtype)


#: What `install` replaces: per layer part, the name its module imports, mlx-lm's function and ours.
REPLACED = (("self_attn", "scaled_dot_product_attention", base.scaled_dot_product_attention, attention),
            ("mlp", "swiglu", activations.swiglu, swiglu))


def install(model) -> int:
    """Point the modules of `model`'s attention and MLP layers at `attention` and `swiglu`; returns how
    many (module, function) pairs now call ours."""
    layers = getattr(getattr(model, "language_model", model), "layers", None) or []
    patched = 0
    for part, name, theirs, ours in REPLACED:
        modules = {type(m).__module__ for layer in layers if (m := getattr(layer, part, None)) is not None}
        for module in filter(None, map(sys.modules.get, sorted(modules))):
            if getattr(module, name, None) is theirs:
                setattr(module, name, ours)
            patched += getattr(module, name, None) is ours
    return patched
