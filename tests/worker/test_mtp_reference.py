"""Differential tests against the reference implementation of Qwen3.5 MTP heads (mlx-vlm, test-only).

The same head, bound to the same target, must propose the same tokens from the
same hidden states, round after round, through acceptances and rejections.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mtpstack.worker.loading import Engine
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams
from tests.reference import import_reference

drafters = import_reference("mlx_vlm.speculative.drafters")

PROMPTS = ["def main():", "import os\nimport sys\n", "The quick brown fox jumps over"]


def greedy(logits):
    return mx.argmax(logits, axis=-1)


class Recorder:
    """Wraps the engine's real head drafter and keeps what each step proposed and verified."""

    def __init__(self, inner):
        self.inner = inner
        self.drafts: list[list[int]] = []
        self.verified: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft(self, rows, depth):
        out = self.inner.draft(rows, depth)
        self.drafts.append(out.tolist())
        return out

    def accept(self, rows, depth, accepted, sampled, drafts, hidden):
        self.verified.append((accepted, sampled, drafts, hidden))
        return self.inner.accept(rows, depth, accepted, sampled, drafts, hidden)


def reference_head(head_dir, engine):
    head, kind = drafters.load_drafter(str(head_dir))
    assert kind == "mtp"
    # mlx-vlm's Nemotron head checks that its target is mlx-vlm's own class; ours is mlx-lm's, with
    # the same embeddings and LM head, which is all `bind` takes from it.
    head.validate_target_compatibility = lambda target: None
    head.reset(engine.target.model)
    return head


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_head_proposes_what_the_reference_proposes_round_after_round(hybrid_pair, prompt, depth):
    assert_proposals_match_reference(*hybrid_pair, prompt, depth)


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("layout", ["standalone", "quantized"])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_a_moe_head_proposes_what_the_reference_proposes_in_each_standalone_layout(moe_pair, layout, prompt, depth):
    """Qwen3.5-MoE heads as users download them: fp32, and 6-bit with 8-bit router gates per path."""
    assert_proposals_match_reference(*moe_pair(layout), prompt, depth)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_a_nemotron_h_head_proposes_what_the_reference_proposes(nemotron_pair, prompt, depth):
    """Nemotron-H (Mamba2 + attention + MoE) with its `nemotron_h_mtp` head, as mlx-vlm's splitter writes it."""
    assert_proposals_match_reference(*nemotron_pair("standalone"), prompt, depth)


def assert_proposals_match_reference(target, head_dir, prompt: str, depth: int) -> None:
    engine = Engine.load(str(target), str(head_dir), draft_depth=depth)
    ids = engine.text_prompt(prompt)
    seq = engine.new_sequence(ids, SamplingParams(max_tokens=28, depth=depth, ignore_eos=True))
    sched = Scheduler(max_num_seqs=1)
    sched.add(seq)
    sched.step()  # prefill: the first token
    recorder = sched.batch.drafter = Recorder(sched.batch.drafter)

    ref = reference_head(head_dir, engine)
    hidden = engine.parts.hidden(mx.array(ids)[None], None)
    ref.prefill_from_target_hidden(mx.array(ids)[None], hidden, mx.array([seq.tokens[0]]), greedy, greedy=True)
    rounds = 0
    while sched.active:
        sched.step()
        if len(recorder.drafts) == rounds:
            continue  # a step without drafting (the last token)
        accepted, sampled, drafts, verify_hidden = recorder.verified[rounds]
        k = len(recorder.drafts[rounds][0])  # fewer than `depth` near max_tokens
        theirs = ref.draft_block(mx.array([seq.y]), verify_hidden[:, -1:], None, k + 1, greedy, greedy=True)
        assert recorder.drafts[rounds] == theirs.tolist(), f"round {rounds}"
        n = accepted[0]
        ref.accept_verified_tokens(verify_hidden, drafts, n, [sampled.tolist()[0][n]], greedy, greedy=True)
        rounds += 1
    assert rounds >= 5
    assert 0 < seq.accepted  # the comparison went through accepted drafts as well as rejected ones


def test_a_folder_written_by_the_reference_splitter_drafts_like_the_bundled_head(tmp_path):
    from mlx_vlm.speculative.drafters.qwen3_5_mtp.split import split_qwen3_5_mtp

    from devkit.demo.tiny_hybrid import build_tiny_bundled_checkpoint

    original = build_tiny_bundled_checkpoint(tmp_path / "original")
    split = split_qwen3_5_mtp(str(original), str(tmp_path / "split"))
    bundled = Engine.load(str(original), str(original), draft_depth=3)
    standalone = Engine.load(str(original), str(split), draft_depth=3)
    assert bundled.drafter.bundled and not standalone.drafter.bundled
    assert bundled.draft_kind == standalone.draft_kind == "mtp"
    for prompt in PROMPTS:
        proposals = []
        for engine in (bundled, standalone):
            seq = engine.new_sequence(engine.text_prompt(prompt), SamplingParams(max_tokens=24, depth=3, ignore_eos=True))
            sched = Scheduler(max_num_seqs=1)
            sched.add(seq)
            sched.step()
            recorder = sched.batch.drafter = Recorder(sched.batch.drafter)
            while sched.active:
                sched.step()
            proposals.append((seq.tokens, recorder.drafts))
        assert proposals[0] == proposals[1], prompt
