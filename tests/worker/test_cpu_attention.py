"""A long chunk's attention split by query rows over CPU streams (worker/cpu_attention.py) is mlx's attention."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import base

from mtpstack.worker import cpu_attention


@pytest.fixture(scope="module")
def engine(hybrid_pair):
    from mtpstack.worker.loading import Engine

    target, head = hybrid_pair
    return Engine.load(str(target), str(head), draft_depth=2)


@pytest.fixture
def two_streams(monkeypatch):
    monkeypatch.setattr(cpu_attention, "_streams", [mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)])


def arrays(rows=1, n=256, span=1024, heads=4, kv=2, d=32, seed=0):
    mx.random.seed(seed)
    return (mx.random.normal((rows, heads, n, d)), mx.random.normal((rows, kv, span, d)), mx.random.normal((rows, kv, span, d)))


def ragged_mask(lengths, n, span):
    query = mx.array(lengths)[:, None] + mx.arange(n)
    return (mx.arange(span)[None, None, :] <= query[:, :, None])[:, None]


def test_a_causal_chunk_split_over_two_streams_is_mlx_s_attention(two_streams):
    q, k, v = arrays()
    assert cpu_attention._splits(q, None, "causal", None) == 2
    got = cpu_attention.attention(q, k, v, None, 0.125, "causal")
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5).item()
    # the split is real: the second half's rows differ from what an unmasked slice would give
    assert not mx.allclose(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125), atol=1e-3).item()


def test_a_ragged_batch_s_mask_is_split_by_rows(two_streams):
    """Rows at different lengths (the prefill batch's mask array, [rows, 1, n, span])."""
    n, span = 192, 700
    q, k, v = arrays(rows=2, n=n, span=span)
    mask = ragged_mask([400, span - n], n, span)
    got = cpu_attention.attention(q, k, v, None, 0.2, mask)
    assert mx.array_equal(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)).item()


def test_no_mask_is_split_too(two_streams):
    q, k, v = arrays(n=128, span=300)
    got = cpu_attention.attention(q, k, v, None, 0.3, None)
    assert mx.allclose(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3), atol=1e-5).item()


@pytest.mark.parametrize("case", ["decode", "quantized", "sinks", "gpu"])
def test_what_is_not_split_takes_mlx_lm_s_own_path(two_streams, monkeypatch, case):
    q, k, v = arrays(n=4 if case == "decode" else 256)

    class Quantized:
        bits, group_size = 4, 64

    cache = Quantized() if case == "quantized" else None
    sinks = mx.zeros((4,)) if case == "sinks" else None
    if case == "gpu":
        monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    assert cpu_attention._splits(q, cache, "causal", sinks) == 1
    called = []
    monkeypatch.setattr(base, "scaled_dot_product_attention", lambda *a, **kw: called.append(kw) or "mlx-lm's")
    assert cpu_attention.attention(q, k, v, cache, 0.1, "causal", sinks) == "mlx-lm's"
    assert called and called[0]["cache"] is cache and called[0]["sinks"] is sinks


def test_one_core_runs_one_stream(monkeypatch):
    monkeypatch.setattr(cpu_attention, "_streams", [])
    monkeypatch.setattr(cpu_attention, "cores", lambda: 1)
    q, _, _ = arrays()
    assert cpu_attention._splits(q, None, "causal", None) == 1


def test_install_points_the_target_s_attention_module_at_the_split(engine):
    """The engine installed it on load: the demo target's attention module calls it."""
    import sys

    attn = next(layer.self_attn for layer in engine.target.model.layers if hasattr(layer, "self_attn"))
    module = sys.modules[type(attn).__module__]
    assert module.scaled_dot_product_attention is cpu_attention.attention
    assert cpu_attention.install(engine.target.model) == 1  # again: nothing more to do, nothing broken
