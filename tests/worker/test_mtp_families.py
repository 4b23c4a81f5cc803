"""MTP families and checkpoint layouts: each loads, drafts, and decodes exactly the target's greedy tokens.

The tiny pairs are built in the layouts real checkpoints use (`devkit.demo.tiny_families`):
Qwen3.5-MoE heads standalone, quantized with per-path 8-bit router gates, and bundled as `mtp.*`
with per-expert or fused experts; Qwen3-Next, Nemotron-H (Mamba2) and GLM-4.7-Flash pairs standalone
and bundled.
"""

from __future__ import annotations

import pytest

from devkit.demo.tiny_families import GATE_BITS, GLM_LAYOUTS, HEAD_BITS, MOE_LAYOUTS, NEMOTRON_LAYOUTS, NEXT_LAYOUTS
from mtpstack.worker.loading import Engine
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams
from tests.mlx_support import QUANTIZED_MOE_REASON, QUANTIZED_MOE_RUNS
from tests.worker.greedy import PROMPTS, decode_forced, plain_greedy

MAX_TOKENS = 20


_PLAIN: dict[int, dict[str, list[int]]] = {}


def plain(engine: Engine) -> dict[str, list[int]]:
    """The target's own greedy tokens (mlx-lm's plain decoding), once per engine."""
    if id(engine) not in _PLAIN:
        _PLAIN[id(engine)] = plain_greedy(engine, MAX_TOKENS)
    return _PLAIN[id(engine)]


def run(engine: Engine, prompts: list[str], depth: int, width: int) -> tuple[dict[str, list[int]], int]:
    """Every prompt decoded greedily, `width` rows at a time: tokens per prompt, and accepted drafts."""
    sched = Scheduler(max_num_seqs=width)
    seqs = {}
    pending = list(prompts)
    while pending or sched.active:
        while pending and len(sched.active) < width:
            p = pending.pop(0)
            seqs[p] = engine.new_sequence(engine.text_prompt(p), SamplingParams(max_tokens=MAX_TOKENS, depth=depth, ignore_eos=True))
            sched.add(seqs[p])
        for seq, _, error in sched.step():
            assert error is None, error
    return {p: s.tokens for p, s in seqs.items()}, sum(s.accepted for s in seqs.values())


@pytest.fixture(scope="module")
def engines(moe_pair, next_pair, nemotron_pair, glm_pair):
    """`engines(layout)` for the MoE pair, `engines("next-<layout>")` for the Qwen3-Next pair,
    `engines("nemotron-<layout>")` for the Nemotron-H pair; loaded once each."""
    cache: dict[str, Engine] = {}

    def get(layout: str) -> Engine:
        if layout == "quantized" and not QUANTIZED_MOE_RUNS:
            pytest.skip(QUANTIZED_MOE_REASON)  # the engine refuses to load it (tested below)
        if layout not in cache:
            family, _, rest = layout.partition("-")
            pairs = {"next": next_pair, "nemotron": nemotron_pair, "glm": glm_pair}
            target, head = pairs[family](rest) if family in pairs else moe_pair(layout)
            cache[layout] = Engine.load(str(target), str(head), draft_depth=4)
        return cache[layout]

    return get


def same_parameters(a, b) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mine, theirs = dict(tree_flatten(a.parameters())), dict(tree_flatten(b.parameters()))
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert mx.allclose(mine[key], theirs[key], atol=1e-6).item(), key


@pytest.mark.parametrize("layout", MOE_LAYOUTS)
def test_every_moe_layout_loads_as_a_qwen3_5_mtp_head(engines, layout):
    engine = engines(layout)
    assert engine.draft_kind == "mtp"
    assert engine.drafter.bundled == layout.startswith("bundled")
    assert engine.target.config["model_type"] == "qwen3_5_moe"


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", MOE_LAYOUTS)
def test_greedy_output_equals_plain_decoding_in_every_layout(engines, layout, depth, width):
    engine = engines(layout)
    expected = plain(engine)
    tokens, accepted = run(engine, PROMPTS, depth, width)
    assert tokens == expected
    assert accepted > 0  # drafts were accepted as well as rejected: both paths ran


def test_the_quantized_head_keeps_its_router_gates_at_their_own_bits(engines):
    layer = engines("quantized").drafter.model.layers[0]
    assert layer.mlp.gate.bits == GATE_BITS
    assert layer.mlp.shared_expert_gate.bits == GATE_BITS
    assert layer.self_attn.q_proj.bits == HEAD_BITS
    assert layer.mlp.switch_mlp.gate_proj.bits == HEAD_BITS


@pytest.mark.parametrize(("layout", "standalone"), [
    ("bundled-per-expert", "standalone"), ("bundled-fused", "standalone"), ("next-bundled", "next-standalone"),
    ("nemotron-bundled", "nemotron-standalone"), ("glm-bundled", "glm-standalone")])
def test_a_bundled_head_is_the_standalone_head(engines, layout, standalone):
    """The same weights, whichever layout they came in: parameter for parameter, after sanitizing."""
    same_parameters(engines(layout).drafter.model, engines(standalone).drafter.model)


@pytest.mark.parametrize("layout", NEXT_LAYOUTS)
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_qwen3_next_greedy_output_equals_plain_decoding(engines, layout, depth, width):
    """mlx-vlm 0.7.10 cannot run MTP on qwen3_next (its target returns no hidden states): equality with
    plain decoding and acceptance of the hand-set head are the test."""
    engine = engines(f"next-{layout}")
    assert engine.target.config["model_type"] == "qwen3_next" and "gated-delta" in engine.cache_kinds
    tokens, accepted = run(engine, PROMPTS, depth, width)
    assert tokens == plain(engine)
    assert accepted > 0


def test_a_qwen3_next_head_split_by_the_reference_loads_as_the_bundled_head(engines, next_pair, tmp_path):
    """The folder layout is the one mlx-vlm's qwen3_next splitter writes (a `qwen3_5_mtp` head)."""
    from tests.reference import import_reference

    split = import_reference("mlx_vlm.speculative.drafters.qwen3_5_mtp.split")
    original, _ = next_pair("bundled")
    folder = split.Qwen3NextMTPSplitter().split(str(original), str(tmp_path / "split"))
    engine = Engine.load(str(original), str(folder), draft_depth=2)
    assert not engine.drafter.bundled
    same_parameters(engine.drafter.model, engines("next-bundled").drafter.model)


def test_a_head_whose_experts_skip_a_number_is_refused_naming_them(tmp_path, moe_pair):
    import shutil

    import mlx.core as mx

    target, _ = moe_pair("bundled-per-expert")
    broken = shutil.copytree(target, tmp_path / "broken")
    weights = mx.load(str(broken / "model.safetensors"))
    for proj in ("gate_proj", "up_proj", "down_proj"):
        weights.pop(f"mtp.layers.0.mlp.experts.2.{proj}.weight")
    mx.save_safetensors(str(broken / "model.safetensors"), weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"cannot be read: .*experts \[0, 1, 3\]"):
        Engine.load(str(broken), str(broken))


@pytest.mark.parametrize("layout", NEMOTRON_LAYOUTS)
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_nemotron_h_greedy_output_equals_plain_decoding(engines, layout, depth, width):
    engine = engines(f"nemotron-{layout}")
    assert engine.target.config["model_type"] == "nemotron_h" and "mamba2" in engine.cache_kinds
    tokens, accepted = run(engine, PROMPTS, depth, width)
    assert tokens == plain(engine)
    assert accepted > 0


@pytest.mark.parametrize("family", ["nemotron", "next", "next-replayed"])
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("depth", [1, 3])
def test_every_acceptance_length_in_every_row_leaves_a_recurrent_familys_greedy_text(engines, family, depth, width, monkeypatch):
    """Mamba2 mixers (Nemotron-H) and Qwen3-Next's gated-delta layers, rolled back to every length in every row
    (Qwen3-Next's also the Metal kernel's way, replayed at commit, here through mlx-lm's ops)."""
    import mtpstack.worker.caches as caches

    monkeypatch.setattr(caches, "_runs_kernel", lambda k: family.endswith("replayed"))
    engine = engines(f"{family.removesuffix('-replayed')}-standalone")
    reference = plain_greedy(engine, 3 * MAX_TOKENS, PROMPTS[:width])
    tokens, seen, ragged = decode_forced(engine, PROMPTS[:width], depth, reference, 3 * MAX_TOKENS)
    assert tokens == [reference[p] for p in PROMPTS[:width]]
    assert seen == [set(range(depth + 1))] * width and (ragged or width == 1)


def test_mamba2_state_after_a_rolled_back_step_equals_the_plain_state(engines):
    """After a step whose drafts are all rejected, each Mamba2 layer's conv and SSM state is the plain one's."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mtpstack.worker.caches import StepStateCache

    engine = engines("nemotron-standalone")
    prompt = engine.text_prompt(PROMPTS[0])
    seq = engine.new_sequence(prompt, SamplingParams(max_tokens=MAX_TOKENS, depth=4, ignore_eos=True))
    sched = Scheduler(max_num_seqs=1)
    sched.add(seq)
    sched.step()  # prefill: the first token is out
    inner = sched.batch.drafter

    class Wrong:
        """The head's real drafting (its caches stay in step), its proposals replaced by certain misses."""

        def __getattr__(self, name):
            return getattr(inner, name)

        def draft(self, rows, depth):
            real = inner.draft(rows, depth)
            return (real + 1) % engine.vocab_size  # never the target's own greedy token where the head was right

    sched.batch.drafter = Wrong()
    sched.step()
    plain = make_prompt_cache(engine.target.model)
    engine.target.model(mx.array(prompt + seq.tokens[:-1])[None], cache=plain)
    states = [(mine, theirs) for mine, theirs in zip(sched.batch.caches, plain) if isinstance(mine, StepStateCache)]
    assert len(states) == 2
    for mine, theirs in states:
        assert mx.allclose(mine[0], theirs[0], atol=1e-5) and mx.allclose(mine[1], theirs[1], atol=1e-5)


@pytest.mark.parametrize("layout", GLM_LAYOUTS)
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_glm4_moe_lite_greedy_output_equals_plain_decoding(engines, layout, depth, width):
    """mlx-vlm 0.7.10 has a splitter for `glm4_moe_lite_mtp` but no model class to compare with: equality
    with plain decoding and acceptance of the hand-set head are the test."""
    engine = engines(f"glm-{layout}")
    assert engine.target.config["model_type"] == "glm4_moe_lite" and engine.draft_kind == "mtp"
    tokens, accepted = run(engine, PROMPTS, depth, width)
    assert tokens == plain(engine)
    assert accepted > 0


def test_a_glm_head_split_by_the_reference_loads_as_the_bundled_head(engines, glm_pair, tmp_path):
    """The folder layout is the one mlx-vlm's glm4_moe_lite splitter writes (flat names, bf16)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from tests.reference import import_reference

    split = import_reference("mlx_vlm.speculative.drafters.glm4_moe_lite_mtp.split")
    original, _ = glm_pair("bundled")
    folder = split.Glm4MoeLiteMTPSplitter().split(str(original), str(tmp_path / "split"))
    engine = Engine.load(str(original), str(folder), draft_depth=2)
    assert not engine.drafter.bundled
    mine = dict(tree_flatten(engine.drafter.model.parameters()))
    theirs = dict(tree_flatten(engines("glm-bundled").drafter.model.parameters()))
    assert mine.keys() == theirs.keys()
    for key in mine:  # the splitter stores bf16
        assert mx.array_equal(mine[key].astype(mx.float32), theirs[key].astype(mx.bfloat16).astype(mx.float32)).item(), key


def test_a_head_of_a_family_not_served_is_refused_at_load_saying_why(monkeypatch, nemotron_pair):
    import dataclasses

    from mtpstack.validator import BY_HEAD_TYPE

    monkeypatch.setitem(BY_HEAD_TYPE, "nemotron_h_mtp", dataclasses.replace(
        BY_HEAD_TYPE["nemotron_h_mtp"], served=False, why_not="its state cannot be rolled back"))
    target, head = nemotron_pair("standalone")
    with pytest.raises(ValueError, match="`nemotron_h_mtp` heads are not served: its state cannot be rolled back") as e:
        Engine.load(str(target), str(head))
    assert "hint: serve the target without a drafter" in str(e.value)


@pytest.mark.parametrize("family", ["standalone", "next-standalone", "nemotron-standalone", "glm-standalone"])
def test_a_prefix_cache_hit_resumes_every_familys_state_exactly(engines, family):
    """A second turn resumes from the first one's snapshot (attention entries, gated-delta or Mamba2
    state, the head's entries) and still decodes exactly the target's greedy tokens."""
    from mtpstack.worker.prefix_cache import PrefixCache

    engine = engines(family)
    first_turn = "def main():\n    import os\n"
    second_turn = first_turn + "    return os.getcwd()\n"
    expected = plain_greedy(engine, MAX_TOKENS, [second_turn])[second_turn]
    sched = Scheduler(1, prefix_cache=PrefixCache(64 << 20))
    seqs = []
    for prompt in (first_turn, second_turn):
        seq = engine.new_sequence(engine.text_prompt(prompt), SamplingParams(max_tokens=MAX_TOKENS, depth=3, ignore_eos=True))
        sched.add(seq)
        while sched.active:
            sched.step()
        seqs.append(seq)
    assert seqs[1].cached_tokens == len(engine.text_prompt(first_turn)) - 1
    assert seqs[1].tokens == expected



def test_quantized_experts_are_refused_at_start_on_an_mlx_that_cannot_run_them(moe_pair, engines):
    from mtpstack.worker.loading import refuse_unrunnable_experts

    if not QUANTIZED_MOE_RUNS:  # the Nix package's mlx on Linux: the load itself refuses, naming the fix
        target, head = moe_pair("quantized")
        with pytest.raises(ValueError) as e:
            Engine.load(str(target), str(head), draft_depth=4)
        assert "has quantized MoE experts" in str(e.value) and "hint: install mlx>=0.32" in str(e.value)
        return
    quantized = engines("quantized").drafter.model
    with pytest.raises(ValueError) as e:
        refuse_unrunnable_experts(quantized, "head", runs=False)  # as on mlx 0.31.2
    assert "has quantized MoE experts" in str(e.value) and "hint: install mlx>=0.32" in str(e.value)
    refuse_unrunnable_experts(quantized, "head", runs=True)
    refuse_unrunnable_experts(engines("standalone").drafter.model, "head", runs=False)  # nothing quantized to run
