"""Batch state that stays resident across steps, with exact per-row rollback in every layer type.

A batch holds one row per active sequence. Every step runs the same number of
positions `T` through every row (a row's real positions first, padding after);
afterwards each row keeps only its own first `keep[r]` positions:

- Attention layers (`RaggedKVCache`): one key/value buffer for the batch with a
  length per row. A row's new positions are written at its own length, the mask
  hides every other row's tail and stale entries, and rolling a row back is
  lowering its length: nothing is copied.
- Recurrent layers (`StepStateCache`: gated-delta linear attention, Mamba2):
  their recurrent and conv state cannot be trimmed, and the recurrence only
  hands back its final state. During a step the layer (switched to
  `step_state_call` or `mamba2_step_state_call` by `install_rollback`) keeps
  what sets any row's state after fewer positions (`StepRecord`), and
  `commit(keep)` takes the final state for every row that kept all positions
  and recovers the others': where mlx-lm's recurrence is one Metal kernel over
  all positions, by running it again over just their kept positions from the
  step's starting state and inputs, which are small; where it is a loop of one
  op a position (the CPU; Mamba2's decoding everywhere), from the states that
  loop yields. No rejected draft ever touches the state that is kept, and no
  layer's weights are read twice.

The rows being prefilled share caches of the same kinds (`batch_caches(...,
prefill=True)`): attention rows as above, gated-delta rows in
`PrefillStateCache`, where mlx-lm's own layer skips each row's padding. A row
leaves the prefill batch (`take_row`) and joins the decoding batch
(`add_row`) once, and leaves that once (`filter`); those, and the prefix
cache's snapshots (`segment`, `row`), are the only copies of a row's cache.
Any other cache type is refused by `install_rollback`, naming the layer. Which mlx-lm classes are
gated-delta layers or Mamba2 mixers, and which layers keep a cache, is each family's to say (its
module's `TARGET`, read through the family table): nothing here names a family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, KVCache
from mlx_lm.models.gated_delta import compute_g, gated_delta_ops, gated_delta_update

from mtpstack.validator import recurrent_target_types
from mtpstack.worker import gated_delta
from mtpstack.worker.mtp.families import served_target_hooks


class CacheNotSupported(ValueError):
    """A layer whose state the engine cannot roll back exactly."""


class RaggedKVCache:
    """Keys and values of a batch whose rows have different lengths; per-row rollback by length."""

    step = 256

    def __init__(self):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.lengths: list[int] = []

    # -- what mlx-lm's attention layers call -------------------------------------------

    @property
    def offset(self) -> mx.array | int:
        """Each row's position of its next token (RoPE offsets): one number when the rows are level."""
        if self._level():
            return self.lengths[0]
        return mx.array(self.lengths, dtype=mx.int32)

    def _level(self) -> bool:
        return len(set(self.lengths)) == 1

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array | str | None:
        """[rows, 1, n, S]: a row's i-th new position sees its own first `length + i + 1` entries. Rows of
        one length need no mask but the causal one, given as mlx-lm's own cache gives it."""
        if window_size is not None:
            raise CacheNotSupported("sliding-window attention cannot share a ragged batch")
        if self._level() and not return_array:
            return None if n == 1 else "causal"
        span = max(self.lengths) + n
        query = mx.array(self.lengths, dtype=mx.int32)[:, None] + mx.arange(n, dtype=mx.int32)
        return (mx.arange(span, dtype=mx.int32)[None, None, :] <= query[:, :, None])[:, None]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        rows, _, n, _ = keys.shape
        span = max(self.lengths) + n
        self._reserve(span, keys, values)
        if self._level():  # one write for every row
            start = self.lengths[0]
            self.keys[:, :, start : start + n, :] = keys
            self.values[:, :, start : start + n, :] = values
        else:  # one scatter each, every row at its own length
            at = (mx.array(self.lengths, dtype=mx.int32)[:, None] + mx.arange(n, dtype=mx.int32))[:, None, :, None]
            self.keys = mx.put_along_axis(self.keys, mx.broadcast_to(at, keys.shape), keys, axis=2)
            self.values = mx.put_along_axis(self.values, mx.broadcast_to(at, values.shape), values, axis=2)
        self.lengths = [length + n for length in self.lengths]
        return self.keys[:, :, :span, :], self.values[:, :, :span, :]

    @property
    def state(self):
        return self.keys, self.values

    # -- batch management ----------------------------------------------------------------

    def _reserve(self, span: int, keys: mx.array, values: mx.array) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        if span <= have:
            return
        size = -(-span // self.step) * self.step
        rows, heads, _, kd = keys.shape
        vd = values.shape[3]
        new_k = mx.zeros((rows, heads, size, kd), keys.dtype)
        new_v = mx.zeros((rows, heads, size, vd), values.dtype)
        if self.keys is not None:
            new_k[:, :, :have, :] = self.keys
            new_v[:, :, :have, :] = self.values
        self.keys, self.values = new_k, new_v

    def rollback(self, drop: list[int]) -> None:
        """Forget each row's last `drop[r]` positions."""
        self.lengths = [length - d for length, d in zip(self.lengths, drop)]

    def add_row(self, keys: mx.array | None, values: mx.array | None) -> None:
        """Append one row holding `keys`/`values` ([1, heads, length, dim]; None: an empty row)."""
        length = 0 if keys is None else keys.shape[2]
        have = 0 if self.keys is None else self.keys.shape[2]
        if keys is None:
            if self.keys is not None:
                self.keys = mx.concatenate([self.keys, mx.zeros((1,) + self.keys.shape[1:], self.keys.dtype)])
                self.values = mx.concatenate([self.values, mx.zeros((1,) + self.values.shape[1:], self.values.dtype)])
            self.lengths = self.lengths + [0]
            return
        size = max(have, -(-max(length, 1) // self.step) * self.step)
        k, v = _pad_to(keys, size), _pad_to(values, size)
        if self.keys is None:
            rows = len(self.lengths)  # earlier rows, all empty
            if rows:
                k = mx.concatenate([mx.zeros((rows,) + k.shape[1:], k.dtype), k])
                v = mx.concatenate([mx.zeros((rows,) + v.shape[1:], v.dtype), v])
            self.keys, self.values = k, v
        else:
            self.keys = mx.concatenate([_pad_to(self.keys, size), k])
            self.values = mx.concatenate([_pad_to(self.values, size), v])
        self.lengths = self.lengths + [length]

    def row(self, r: int) -> tuple[mx.array | None, mx.array | None]:
        """Row r's keys and values, [1, heads, length, dim] (None when it is empty)."""
        return self.segment(r, 0, self.lengths[r])

    def segment(self, r: int, start: int, end: int) -> tuple[mx.array | None, mx.array | None]:
        """Row r's positions start..end-1, as arrays of their own (None when empty)."""
        if end <= start or self.keys is None:
            return None, None
        return (mx.contiguous(self.keys[r : r + 1, :, start:end, :]),
                mx.contiguous(self.values[r : r + 1, :, start:end, :]))

    def filter(self, rows: list[int]) -> None:
        """Keep only `rows`, in that order."""
        if not rows:
            self.keys = self.values = None
            self.lengths = []
            return
        index = mx.array(rows, dtype=mx.int32)
        self.keys, self.values = self.keys[index], self.values[index]
        self.lengths = [self.lengths[r] for r in rows]

    def commit(self, keep: list[int], ran: int) -> None:
        """After a step of `ran` positions per row, keep each row's first `keep[r]`."""
        self.rollback([ran - k for k in keep])


def _pad_to(x: mx.array, size: int) -> mx.array:
    if x.shape[2] >= size:
        return x
    pad = mx.zeros(x.shape[:2] + (size - x.shape[2],) + x.shape[3:], x.dtype)
    return mx.concatenate([x, pad], axis=2)


def _cat_rows(have: mx.array | None, rows: int, new: mx.array | None) -> mx.array | None:
    """`have` (state of `rows` rows, None: all zero) with one more row; zeros stand in for a missing side."""
    if have is None and new is None:
        return None
    if have is None:
        have = mx.zeros((rows,) + new.shape[1:], new.dtype) if rows else None
    if new is None:
        new = mx.zeros((1,) + have.shape[1:], have.dtype)
    return new if have is None else mx.concatenate([have, new])


class StateRows(ArraysCache):
    """A gated-delta layer's conv and recurrent state, a row per sequence: rows join, leave and are copied out."""

    def __init__(self):
        super().__init__(size=2)
        self.rows = 0

    def add_row(self, conv: mx.array | None, state: mx.array | None) -> None:
        self.cache = [_cat_rows(self[0], self.rows, conv), _cat_rows(self[1], self.rows, state)]
        self.rows += 1

    def row(self, r: int) -> tuple[mx.array | None, mx.array | None]:
        """Row r's conv and recurrent state as arrays of their own (None where the batch has none yet)."""
        return tuple(None if c is None else mx.contiguous(c[r : r + 1]) for c in self.cache)

    def filter(self, rows: list[int]) -> None:
        index = mx.array(rows, dtype=mx.int32) if rows else None
        self.cache = [None if c is None or index is None else c[index] for c in self.cache]
        self.rows = len(rows)


@dataclass
class StepRecord:
    """What a recurrent layer keeps through a step, so that `commit` can set each row's state after
    only its kept positions."""

    conv_input: mx.array  # [rows, tail + T, conv_dim]: the conv window before the step, then the step's inputs
    tail: int  # the conv window's length (kernel - 1)
    final: mx.array  # every row's recurrent state after all T positions
    #: keep -> every row's state after its first keep[r] positions (called only when some row kept fewer than T)
    state_after: Callable[[list[int]], mx.array]


class StepStateCache(StateRows):
    """Conv and recurrent state of a recurrent layer for a batch, committed per row after each step."""

    def __init__(self):
        super().__init__()
        self.pending: StepRecord | None = None

    def make_mask(self, n: int):
        return None  # every row runs every position; `commit` decides what is kept

    def commit(self, keep: list[int], ran: int) -> None:
        record, self.pending = self.pending, None
        if min(keep) == ran:  # every row kept every position: the step's own final state and window
            self[0] = mx.contiguous(record.conv_input[:, -record.tail :, :])
            self[1] = record.final
            return
        kept = mx.array(keep, dtype=mx.int32)
        window = (kept[:, None] + mx.arange(record.tail, dtype=mx.int32))[..., None]
        self[0] = mx.take_along_axis(record.conv_input, window, axis=1)
        self[1] = record.state_after(keep)



class PrefillStateCache(StateRows):
    """Conv and recurrent state of a gated-delta layer for the rows being prefilled together.

    Rows run chunks of different lengths in one forward, padded on the right.
    mlx-lm's own layer does the rest (`lengths`, set by `prepare` before the
    forward): padded positions leave the recurrent state alone and the conv
    window is taken at each row's last real position, so nothing is rolled back.
    """

    def commit(self, keep: list[int], ran: int) -> None:
        self.finalize()


# -- gated-delta layers that can set a row's state after fewer positions -----------------


def step_state_call(layer, inputs: mx.array, mask=None, cache=None) -> mx.array:
    """The gated-delta layer's forward, keeping what sets any row's state after fewer positions.

    Same maths as mlx-lm's layer, whose `gated_delta_update` runs the recurrence over all positions
    in one call. Where that call is its Metal kernel (one launch, which hands back only the final
    state), `commit` takes the final state, and for rows that rejected drafts replays the recurrence
    over their kept positions from the step's small inputs (`_replay`). Elsewhere (the CPU) the call
    is a loop of one op a position, which yields every position's state at no cost: the same loop
    runs here and keeps them, and `commit` picks (`_states_ops`). Used only with a `StepStateCache`.
    The input projections are the family's (`TargetHooks.gated_delta`).
    """
    if isinstance(cache, PrefillStateCache) and not _kernel_for(layer.head_k_dim):
        return gated_delta.prefill_call(layer, inputs, mask, cache)  # a prompt chunk: the recurrence in blocks of positions
    if not isinstance(cache, StepStateCache):
        return type(layer).__mro__[1].__call__(layer, inputs, mask, cache)
    rows, n, _ = inputs.shape
    qkv, z, b, a = layer._project(layer, inputs)
    conv_input = gated_delta.conv_input(layer, cache, qkv)
    q, k, v = gated_delta.conv_qkv(layer, conv_input)
    start, tail = cache[1], layer.conv_kernel_size - 1
    if _runs_kernel(k):
        out, final = gated_delta_update(q, k, v, a, b, layer.A_log, layer.dt_bias, start, None, use_kernel=True)
        cache.pending = StepRecord(conv_input, tail, final, lambda keep: _replay(layer, (q, k, v, a, b), start, final, keep))
    else:
        out, states = _states_ops(layer, q, k, v, a, b, start)
        cache.pending = StepRecord(conv_input, tail, states[-1], lambda keep: _pick(states, keep))
    out = layer.norm(out, z)
    return layer.out_proj(out.reshape(rows, n, -1))


def _runs_kernel(k: mx.array) -> bool:
    """Whether mlx-lm's `gated_delta_update` runs its Metal kernel for these keys (its own condition)."""
    return _kernel_for(k.shape[-1])


def _kernel_for(key_dim: int) -> bool:
    return mx.default_device() == mx.gpu and mx.metal.is_available() and key_dim >= 32 and key_dim % 32 == 0


def _states_ops(layer, q, k, v, a, b, state):
    """mlx-lm's `gated_delta_update` without its kernel, step for step: its loop (`gated_delta_ops`, one
    compiled step a position) run one position a call, keeping the state after every position: outputs
    [rows, T, heads, dim] and T states."""
    beta, g = mx.sigmoid(b), compute_g(layer.A_log, a, layer.dt_bias)
    ys, states = [], []
    for t in range(q.shape[1]):
        y, state = gated_delta_ops(*(x[:, t : t + 1] for x in (q, k, v, g, beta)), state)
        ys.append(y)
        states.append(state)
    return mx.concatenate(ys, axis=1), states


def _pick(states: list[mx.array], keep: list[int]) -> mx.array:
    """Each row's state after its last kept position, taken row by row from the states the step kept:
    one more copy of one state per row, never a stack of all of them."""
    return mx.concatenate([states[n - 1][r : r + 1] for r, n in enumerate(keep)])


def _replay(layer, inputs: tuple, start: mx.array | None, final: mx.array, keep: list[int]) -> mx.array:
    """Every row's gated-delta state after its first `keep[r]` positions: `final` where a row kept all
    of them, else the recurrence run again over just the kept positions from the step's starting state,
    one call per distinct kept length (so each is the very call a forward of that many positions makes)."""
    ran = inputs[0].shape[1]
    groups: dict[int, list[int]] = {}
    for r, n in enumerate(keep):
        groups.setdefault(n, []).append(r)
    if len(groups) == 1:  # every row kept the same length (fewer than `ran`: `commit` took `final` else)
        (n,) = groups
        return gated_delta_update(*(x[:, :n] for x in inputs), layer.A_log, layer.dt_bias, start, None, use_kernel=True)[1]
    parts, order = [], []
    for n, rs in groups.items():
        index = mx.array(rs, dtype=mx.int32)
        parts.append(final[index] if n == ran else gated_delta_update(
            *(x[index, :n] for x in inputs), layer.A_log, layer.dt_bias, None if start is None else start[index], None,
            use_kernel=True)[1])
        order += rs
    at = [0] * len(keep)  # where each row's state lands once the groups' states are joined
    for i, r in enumerate(order):
        at[r] = i
    return mx.concatenate(parts)[mx.array(at, dtype=mx.int32)]


_SWAPPED: dict[type, type] = {}


def _step_state_class(cls: type, project) -> type:
    if cls not in _SWAPPED:
        _SWAPPED[cls] = type(f"StepState{cls.__name__}", (cls,), {"__call__": step_state_call, "_project": staticmethod(project)})
    return _SWAPPED[cls]


def layers_of(model) -> list:
    layers = getattr(model, "layers", None)
    if layers is None:
        raise CacheNotSupported(f"`{type(model).__name__}` exposes no `layers`")
    return list(layers)


def _cache_layers(model, caches: list, keeps: list) -> list:
    """The layer each cache of `make_prompt_cache` belongs to: one per layer, or one per layer that
    keeps state, as a family says (`keeps`: Nemotron-H's MLP and MoE blocks keep none)."""
    layers = layers_of(model)
    if len(layers) != len(caches):
        layers = [layer for layer in layers if any(keeps_cache(layer) for keeps_cache in keeps)]
    return layers + [None] * (len(caches) - len(layers))


def install_rollback(model) -> list[str]:
    """Make `model` roll back exactly: installs the rollback forward (`step_state_call`) on every supported
    gated-delta and Mamba2 layer (the class is swapped in place; weights and plain use are unchanged).
    Returns each cache's kind (`kv`, `gated-delta` or `mamba2`, as the family table spells them);
    raises `CacheNotSupported` naming any other layer."""
    from mlx_lm.models.cache import make_prompt_cache

    hooks = served_target_hooks()
    projections = {cls: project for h in hooks for cls, project in h.gated_delta.items()}
    mamba2 = frozenset().union(*(h.mamba2 for h in hooks))
    kinds = []
    caches = make_prompt_cache(model)
    for i, (cache, layer) in enumerate(zip(caches, _cache_layers(model, caches, [h.keeps_cache for h in hooks if h.keeps_cache]))):
        if type(cache) is KVCache:
            kinds.append("kv")
            continue
        linear = getattr(layer, "linear_attn", None)
        base = type(linear).__mro__[1] if type(linear) in _SWAPPED.values() else type(linear)
        if type(cache) is ArraysCache and base in projections:
            linear.__class__ = _step_state_class(base, projections[base])
            kinds.append("gated-delta")
            continue
        mixer = getattr(layer, "mixer", None)
        base = type(mixer).__mro__[1] if type(mixer) in _SWAPPED.values() else type(mixer)
        if type(cache) is ArraysCache and base in mamba2:
            if base not in _SWAPPED:
                _SWAPPED[base] = type(f"StepState{base.__name__}", (base,), {"__call__": mamba2_step_state_call})
            mixer.__class__ = _SWAPPED[base]
            kinds.append("mamba2")
            continue
        what = type(linear or mixer).__name__ if (linear or mixer) is not None else type(layer).__name__
        served = ", ".join(recurrent_target_types())
        raise CacheNotSupported(
            f"layer {i} (`{what}`) keeps its state in `{type(cache).__name__}`, which the engine cannot roll back "
            f"exactly; supported: attention layers with a plain KV cache and the recurrent layers of {served}"
        )
    return kinds


# -- Mamba2 mixers that keep every position's state (mlx-lm decodes them one position at a time) --


def mamba2_step_state_call(mixer, hidden_states: mx.array, mask=None, cache=None) -> mx.array:
    """The Mamba2 mixer's forward, keeping the SSM state after every position.

    Same maths as mlx-lm's mixer (its own `ssm_update`, one position at a time, as plain decoding
    runs it); used only with a `StepStateCache`, whose `commit` then picks each row's state.
    """
    if not isinstance(cache, StepStateCache):
        return type(mixer).__mro__[1].__call__(mixer, hidden_states, mask, cache)
    from mlx_lm.models.ssm import ssm_update

    rows, n, _ = hidden_states.shape
    inner, conv_dim, groups, size = mixer.intermediate_size, mixer.conv_dim, mixer.n_groups, mixer.ssm_state_size
    gate, conv_input, dt = mx.split(mixer.in_proj(hidden_states), [inner, inner + conv_dim], axis=-1)
    conv_state = cache[0]
    if conv_state is None:
        conv_state = mx.zeros((rows, mixer.conv_kernel_size - 1, conv_dim), dtype=conv_input.dtype)
    padded = mx.concatenate([conv_state, conv_input], axis=1)
    conv_out = nn.silu(mixer.conv1d(padded))
    x, B, C = mx.split(conv_out, [inner, inner + groups * size], axis=-1)
    x = x.reshape(rows, n, mixer.num_heads, mixer.head_dim)
    B = B.reshape(rows, n, groups, size)
    C = C.reshape(rows, n, groups, size)
    D = mixer.D.astype(x.dtype)
    state = cache[1]
    outs, states = [], []
    for t in range(n):
        p = slice(t, t + 1)
        y, state = ssm_update(x[:, p], mixer.A_log, B[:, p], C[:, p], D, dt[:, p], mixer.dt_bias, state, mixer.time_step_limit)
        outs.append(y)
        states.append(state)
    cache.pending = StepRecord(padded, mixer.conv_kernel_size - 1, states[-1], lambda keep: _pick(states, keep))
    y = mx.concatenate(outs, axis=1).reshape(rows, n, inner)
    return mixer.out_proj(mixer.norm(y, gate))


def batch_caches(kinds: list[str], *, prefill: bool = False) -> list:
    """Empty batch caches for layers of these kinds: the decoding batch's, or (`prefill`) the prefilling rows'."""
    state = PrefillStateCache if prefill else StepStateCache
    return [RaggedKVCache() if kind == "kv" else state() for kind in kinds]


def prepare_chunk(caches: list, lengths: list[int]) -> None:
    """Before a prefill forward of right-padded chunks: each row's real length."""
    for cache in caches:
        if isinstance(cache, PrefillStateCache):
            cache.prepare(lengths=lengths)


def take_row(caches: list, r: int) -> list[tuple]:
    """Row r of every layer, as arrays of its own: what `add_row` takes back, here or in another batch."""
    return [cache.row(r) for cache in caches]


def add_row(caches: list, parts: list[tuple] | None) -> None:
    """Append one row to every layer (None: an empty row)."""
    for i, cache in enumerate(caches):
        cache.add_row(*(parts[i] if parts is not None else (None, None)))


def filter_rows(caches: list, rows: list[int]) -> None:
    for cache in caches:
        cache.filter(rows)


def commit(caches: list, keep: list[int], ran: int) -> None:
    for cache in caches:
        cache.commit(keep, ran)
