"""A prompt chunk's attention and SwiGLU computed in numpy on the CPU (worker/cpu_kernels.py) are mlx's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import sysconfig
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import activations, base

from mtpstack.worker import cpu_kernels


@pytest.fixture(scope="module")
def engine(hybrid_pair):
    from mtpstack.worker.loading import Engine

    target, head = hybrid_pair
    return Engine.load(str(target), str(head), draft_depth=2)


def arrays(rows=1, n=256, span=1024, heads=4, kv=2, d=32, seed=0, dtype=mx.float32):
    mx.random.seed(seed)
    shapes = ((rows, heads, n, d), (rows, kv, span, d), (rows, kv, span, d))
    return tuple(mx.random.normal(s).astype(dtype) for s in shapes)


def ragged_mask(lengths, n, span):
    query = mx.array(lengths)[:, None] + mx.arange(n)
    return (mx.arange(span)[None, None, :] <= query[:, :, None])[:, None]


def float64_attention(q, k, v, scale, seen):
    """The exact answer: `seen` [rows, n, S] the keys each query row sees."""
    q, k, v = (np.asarray(x).astype(np.float64) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = np.where(seen[:, None], q @ k.transpose(0, 1, 3, 2) * scale, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def close(got, want, atol=1e-5):
    assert got.shape == want.shape and got.dtype == want.dtype
    return mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=atol).item()


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 8 query rows at a 1,024-key context: a chunk's rows in several blocks."""
    monkeypatch.setattr(cpu_kernels, "BLOCK_ENTRIES", 8 * 4 * 1024)


@pytest.mark.parametrize("blocks", ["one block", "several"])
def test_a_causal_chunk_is_mlx_s_attention_and_nearer_the_exact_one(request, blocks):
    if blocks == "several":
        request.getfixturevalue("small_blocks")
    q, k, v = arrays()
    assert cpu_kernels._takes(q, None, "causal", None)
    got = cpu_kernels.attention(q, k, v, None, 0.125, "causal")
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert close(got, want)
    # the mask is real: a row sees the keys up to its own position counted from the end
    assert not close(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125), atol=1e-3)
    n, span = q.shape[2], k.shape[2]
    exact = float64_attention(q, k, v, 0.125, (np.arange(span)[None, :] <= (span - n + np.arange(n))[:, None])[None])
    # nearer on average: the largest single error is a coin toss between the two where the blocks are small
    # (2.3e-7 against mlx's 2.2e-7 on one machine's OpenBLAS, whose small products sum in another order)
    assert np.abs(np.asarray(got) - exact).mean() < np.abs(np.asarray(want) - exact).mean()


@pytest.mark.parametrize("kind", ["boolean", "additive"])
def test_a_ragged_batch_s_mask_is_applied_per_row(small_blocks, kind):
    """Rows at different lengths (the prefill batch's mask array, [rows, 1, n, span])."""
    n, span = 192, 700
    q, k, v = arrays(rows=2, n=n, span=span)
    mask = ragged_mask([400, span - n], n, span)
    if kind == "additive":
        mask = mx.where(mask, 0.0, -1e9)
    got = cpu_kernels.attention(q, k, v, None, 0.2, mask)
    assert close(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask))


def test_no_mask_and_a_cache_s_sliced_views():
    q, _, _ = arrays(n=128, span=300)
    buffer = mx.random.normal((1, 2, 400, 32))  # a KV cache hands out slices of its buffer
    k, v = buffer[:, :, :300], buffer[:, :, 50:350]
    assert close(cpu_kernels.attention(q, k, v, None, 0.3, None), mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3))


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_half_precision_is_computed_in_float32_and_given_back_in_its_own_type(dtype):
    q, k, v = arrays(dtype=dtype)
    got = cpu_kernels.attention(q, k, v, None, 0.125, "causal")
    assert close(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal"), atol=1e-2)


@pytest.mark.parametrize("case", ["decode", "quantized", "sinks", "gpu"])
def test_what_is_not_taken_goes_mlx_lm_s_own_path(monkeypatch, case):
    q, k, v = arrays(n=4 if case == "decode" else 256)

    class Quantized:
        bits, group_size = 4, 64

    cache = Quantized() if case == "quantized" else None
    sinks = mx.zeros((4,)) if case == "sinks" else None
    if case == "gpu":
        monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    assert not cpu_kernels._takes(q, cache, "causal", sinks)
    called = []
    monkeypatch.setattr(base, "scaled_dot_product_attention", lambda *a, **kw: called.append(kw) or "mlx-lm's")
    assert cpu_kernels.attention(q, k, v, cache, 0.1, "causal", sinks) == "mlx-lm's"
    assert called and called[0]["cache"] is cache and called[0]["sinks"] is sinks


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_a_chunk_s_swiglu_is_mlx_s_even_where_exp_overflows(dtype):
    mx.random.seed(1)
    gate = (mx.random.normal((1, 64, 2048)) * 8).astype(dtype)
    gate[0, 0, :4] = mx.array([-1000.0, -90.0, 90.0, 1000.0]).astype(dtype)
    up = mx.random.normal((1, 64, 2048)).astype(dtype)
    assert gate.size >= cpu_kernels.MIN_ENTRIES
    got, want = cpu_kernels.swiglu(gate, up), activations.swiglu(gate, up)
    assert close(got, want, atol=1e-4 if dtype == mx.float32 else 0.5)
    assert not mx.isnan(got).any().item()


def test_a_decode_step_s_swiglu_goes_mlx_lm_s_own_path(monkeypatch):
    called = []
    monkeypatch.setattr(activations, "swiglu", lambda g, x: called.append(g.shape) or "mlx-lm's")
    assert cpu_kernels.swiglu(mx.ones((1, 4, 2048)), mx.ones((1, 4, 2048))) == "mlx-lm's" and called


def test_install_points_the_target_s_attention_and_mlp_modules_here(engine):
    """The engine installed them on load: the demo target's attention and MLP modules call these."""
    layers = engine.target.model.layers
    attn = sys.modules[type(next(layer.self_attn for layer in layers if hasattr(layer, "self_attn"))).__module__]
    mlp = sys.modules[type(layers[0].mlp).__module__]
    assert attn.scaled_dot_product_attention is cpu_kernels.attention
    assert mlp.swiglu is cpu_kernels.swiglu
    assert cpu_kernels.install(engine.target.model) == 2  # again: nothing more to do, nothing broken


#: mlx-lm's own greedy tokens for a prompt, and its logits over the prompt's last positions, in a process of
#: its own: nothing there is patched.
PLAIN_GREEDY = textwrap.dedent("""
    import json, sys
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    model, _ = load(sys.argv[1])
    ids, n = json.loads(sys.argv[2]), int(sys.argv[3])
    logits = model(mx.array(ids)[None])[0, -16:].astype(mx.float32)
    print(json.dumps({"tokens": [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)],
                      "logits": logits.tolist()}))
""")


@pytest.fixture(scope="module")
def demo_engine():
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET
    from mtpstack.worker.loading import Engine

    return Engine.load(str(DEMO_TARGET), str(DEMO_HEAD), draft_depth=3)


def test_a_long_prompt_s_greedy_text_through_these_is_unpatched_mlx_lm_s(demo_engine, monkeypatch):
    """Issue 47's lossless bar: over several chunks of a long prompt (the numpy paths taken, counted), the
    demo target with its head gives the greedy tokens mlx-lm gives in a process where nothing is patched,
    and its logits there agree to float32's rounding (a wrong scale or mask would move them)."""
    from devkit.engine import run
    from mtpstack.worker.demo import DEMO_TARGET
    from mtpstack.worker.sequence import SamplingParams

    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()
    ids = demo_engine.text_prompt(text)[:700]  # a 512-token chunk and a 188-token one
    taken = []
    monkeypatch.setattr(cpu_kernels, "_one_row", lambda *a, one=cpu_kernels._one_row: taken.append(1) or one(*a))
    seq = run(demo_engine.new_sequence(ids, SamplingParams(max_tokens=24, depth=3, ignore_eos=True)))
    assert taken and seq.drafted  # the prompt's attention went through numpy, and the head drafted
    taken.clear()
    ours = demo_engine.target.model(mx.array(ids)[None])[0, -16:]
    assert taken  # one forward over the whole prompt: numpy's attention again
    plain = subprocess.run([sys.executable, "-c", PLAIN_GREEDY, str(DEMO_TARGET), json.dumps(ids), "24"],
                           capture_output=True, text=True, timeout=300, check=True)
    theirs = json.loads(plain.stdout.splitlines()[-1])
    assert seq.tokens == theirs["tokens"]
    assert np.allclose(np.asarray(ours), np.array(theirs["logits"], np.float32), atol=1e-4)


def test_numpy_s_own_blas_is_held_to_one_thread_beside_mlx_s():
    """Pip's numpy bundles an OpenBLAS of its own; its threads and mlx's fought over the cores (a decode
    step 103 -> 308 ms), so the pool's first use holds it to one thread: its own count says so."""
    import ctypes

    path = cpu_kernels.one_thread_numpy_blas()
    if path is None:
        pytest.skip("this numpy has no OpenBLAS of its own (it uses the system's, or Accelerate)")
    lib = ctypes.CDLL(path)
    get = next(getattr(lib, n) for n in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads") if hasattr(lib, n))
    assert get() == 1
