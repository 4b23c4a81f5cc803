"""What the engine's lossless tests compare against: the target's own greedy tokens, from mlx-lm's
plain `generate_step` (its own caches, no speculation), for a shared set of prompts."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import generate_step

PROMPTS = [
    "def main():",
    "The quick brown fox jumps over",
    "import os\nimport sys\n",
    "Copyright (C) 2024 Free Software Foundation, Inc.\n",
    "x",
]


def plain_greedy(engine, max_tokens: int, prompts: list[str] = PROMPTS) -> dict[str, list[int]]:
    """prompt -> the target's greedy tokens without speculation."""
    return {
        p: [t for t, _ in generate_step(mx.array(engine.text_prompt(p)), engine.target.model, max_tokens=max_tokens)]
        for p in prompts
    }


class ForcedDrafter:
    """A batch's real drafter (its caches and next proposals stay in step) whose proposals are replaced by each
    row's true greedy continuation, wrong from a chosen position on.

    Row r's proposals at its s-th step are wrong from position `(s + r) % (k + 1)` (k: all right), so over
    k + 1 steps every row accepts every length 0..k, and rows of one step accept different lengths: every
    per-row rollback the target can be asked for is asked for. `truth[seq]` is the target's greedy tokens
    for that row's prompt; `seen[seq]` collects the acceptance lengths of its steps at full depth."""

    def __init__(self, inner, truth: dict, vocab: int):
        self.inner, self.truth, self.vocab = inner, truth, vocab
        self.steps: dict = {}
        self.seen: dict = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft(self, rows, depth):
        self.inner.draft(rows, depth)  # keeps the drafter's own caches and seeds in step
        proposals = []
        for r, seq in enumerate(rows):
            done, step = len(seq.tokens), self.steps.get(seq, 0)
            good = (self.truth[seq][done : done + depth] + [0] * depth)[:depth]
            wrong_at = (step + r) % (depth + 1)
            proposals.append([t if i < wrong_at else (t + 1) % self.vocab for i, t in enumerate(good)])
            self.steps[seq] = step + 1
        return mx.array(proposals, dtype=mx.uint32)

    def accept(self, rows, depth, accepted, sampled, drafts, hidden):
        for seq, n in zip(rows, accepted):
            if seq.plan() == depth:  # the row drafted the step's full depth
                self.seen.setdefault(seq, set()).add(n)
        return self.inner.accept(rows, depth, accepted, sampled, drafts, hidden)


def decode_forced(engine, prompts: list[str], depth: int, reference: dict[str, list[int]], max_tokens: int):
    """`prompts` decoded greedily as rows of one batch at `depth` with a `ForcedDrafter`: each row's tokens,
    the acceptance lengths each row met at full depth, and whether some step's rows accepted different lengths."""
    from mtpstack.worker.scheduler import Scheduler
    from mtpstack.worker.sequence import SamplingParams

    sched = Scheduler(max_num_seqs=len(prompts))
    seqs = [engine.new_sequence(engine.text_prompt(p), SamplingParams(max_tokens=max_tokens, depth=depth, ignore_eos=True))
            for p in prompts]
    for seq in seqs:
        sched.add(seq)
    forced = ForcedDrafter(sched.batch.drafter, {seq: reference[p] for seq, p in zip(seqs, prompts)}, engine.vocab_size)
    sched.batch.drafter = forced
    ragged = False
    while sched.active:
        lengths = {r.accepted for _, r, _ in sched.step() if r is not None and r.drafted}
        ragged = ragged or len(lengths) > 1
    return [seq.tokens for seq in seqs], [forced.seen.get(seq, set()) for seq in seqs], ragged
