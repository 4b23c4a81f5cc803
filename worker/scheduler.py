"""The generation loop's seam: which rows run each step, and how the step's tokens are shared.

The scheduler owns the active sequences and the two batches (`mtpstack.worker.batch`); the
batches own the caches, and the prefix cache is reached only through the prefill batch's
`Snapshots` (`mtpstack.worker.snapshots`): nothing here touches a cache's rows.
"""

from __future__ import annotations

import logging
import time

from mtpstack.worker import sequence
from mtpstack.worker.batch import Batch, PrefillBatch
from mtpstack.worker.pacing import Pacer
from mtpstack.worker.prefix_cache import PrefixCache
from mtpstack.worker.sequence import Sequence, StepResult
from mtpstack.worker.snapshots import Snapshots

log = logging.getLogger("mtpstack.worker")

#: How long an idle step waits for a read from the prefix cache's disk tier before returning.
READ_POLL = 0.05

#: One sequence's outcome of a step: its result, or the error that ended it (both None: it had ended).
Outcome = tuple[Sequence, StepResult | None, BaseException | None]


class Scheduler:
    """`step()` advances every decoding sequence once, and the prompts going in when their budget allows.

    Every decoding sequence is a row of one resident batch that drafts and
    verifies in one forward (rows accept different lengths and may draft
    different depths); every sequence still prefilling is a row of the prefill
    batch, which runs a chunk of each prompt in one forward. While rows decode,
    the prefill is paced in time (`mtpstack.worker.pacing`): a chunk as large as
    keeps their gap between tokens short, run once the decoding rows have had
    their share of the time, so they keep about half their rate while a long
    prompt goes in beside them, and no row waits for another's whole prompt.
    With a prefix cache, a prompt resumes from the deepest snapshot it begins with.
    """

    def __init__(self, max_num_seqs: int, prefix_cache: PrefixCache | None = None):
        self.max_num_seqs = max_num_seqs
        self.prefix_cache = prefix_cache
        self.active: list[Sequence] = []
        self.batch: Batch | None = None
        self.prefilling: PrefillBatch | None = None
        self.batched_steps = 0  # target forwards shared by more than one sequence
        self.decode_steps = 0  # batched decode forwards (draft and verify of every decoding row), any width
        self.decode_seconds = 0.0  # wall time spent in them, on the generation thread
        self.pacer = Pacer()
        self.prefill_seconds = 0.0  # wall time spent in prefill forwards, on the generation thread

    def add(self, seq: Sequence) -> None:
        if len(self.active) >= self.max_num_seqs:
            raise RuntimeError("scheduler full")
        if self.batch is None:
            self.batch = Batch(seq.engine)
            snapshots = Snapshots(self.prefix_cache, seq.engine.cache_kinds)
            self.prefilling = PrefillBatch(seq.engine, self.batch.drafter, snapshots)
        self.active.append(seq)

    def drop_cancelled(self) -> list[Sequence]:
        """Remove sequences whose client went away; cheap, so the loop runs it every iteration."""
        dropped = [seq for seq in self.active if seq.cancelled]
        for seq in dropped:
            seq.cancel()
            self.active.remove(seq)
            if self.prefilling is not None and not seq.prefilling:
                self.prefilling.snapshots.forget(seq)  # it may have waited for a read from disk
        if dropped and self.batch is not None:
            self.batch.remove_finished()
            self.prefilling.remove_finished()
        return dropped

    def step(self, budget: int | None = None, depth: int | None = None) -> list[Outcome]:
        """One step of each active sequence; finished or cancelled ones leave the active set. `budget`: the
        prompt tokens the step may prefill beside decoding rows (default: the pacer's, `Pacer.budget_tokens`);
        `depth`: the decoding rows' draft depth where it is `auto` (default: the policy's, `Batch.plans`)."""
        results: list[Outcome] = []
        for seq in list(self.active):
            if seq.cancelled:
                seq.cancel()
            if seq.finished:
                self.active.remove(seq)
                results.append((seq, None, None))
                if self.prefilling is not None and not seq.prefilling:
                    self.prefilling.snapshots.forget(seq)
        if self.batch is None:
            return results
        batch, prefilling = self.batch, self.prefilling
        batch.remove_finished()
        prefilling.remove_finished()
        decoding = list(batch.rows)
        if decoding:
            started = time.perf_counter()
            try:
                results.extend((seq, result, error) for seq, (result, error) in zip(decoding, batch.decode(depth)))
                self.decode_steps += 1
                seconds = time.perf_counter() - started
                self.decode_seconds += seconds
                self.pacer.decoded(seconds)
                if (policy := getattr(batch.engine, "depth_policy", None)) is not None:
                    policy.observe_step(len(decoding), batch.last_depth, seconds)
                if len(decoding) > 1:
                    self.batched_steps += 1
            except Exception as e:  # the shared forward failed: every row of it; the loop goes on
                log.exception("batched step failed")
                for seq in decoding:
                    seq.finish_reason = "error"
                    results.append((seq, None, e))
        for seq in self.active:
            # A sequence whose snapshot is being read from disk waits; the others go on meanwhile.
            if not seq.in_batch and not seq.prefilling and not seq.finished and prefilling.snapshots.ready(seq):
                prefilling.admit(seq)
        share = self._share(decoding, len(prefilling.rows), budget) if prefilling.rows else 0
        if share:
            started = time.perf_counter()
            try:
                prefilled = prefilling.step(share, batch)
                results.extend(prefilled)
                seconds = time.perf_counter() - started
                self.prefill_seconds += seconds
                self.pacer.prefilled(sum(r.prefill for _, r, _ in prefilled if r is not None), seconds, beside=bool(decoding))
            except Exception as e:  # one broken forward must not stop the loop
                log.exception("prefill failed")
                for seq in prefilling.rows:
                    seq.finish_reason = "error"
                    results.append((seq, None, e))
        self.pacer.step_ended(bool(decoding))
        batch.remove_finished()
        prefilling.remove_finished()
        for seq, _, _ in results:
            if seq.finished and seq in self.active:
                self.active.remove(seq)
        if not decoding and not prefilling.rows and prefilling.snapshots.waiting():
            prefilling.snapshots.wait(READ_POLL)  # nothing else to run: no spinning while the disk reads
        return results

    def _share(self, decoding: list[Sequence], prefilling: int, budget: int | None = None) -> int:
        """Prompt tokens each prefilling row runs this step: a whole chunk when nothing decodes, else what
        the step's time budget leaves them (`Pacer.share`; 0: this step runs none)."""
        chunk = sequence.PREFILL_CHUNK  # read at each step: one value with `Sequence.next_chunk`
        if not decoding:
            return chunk
        return self.pacer.share(prefilling, chunk, budget)
