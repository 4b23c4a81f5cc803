"""The two batches a step runs: the decoding rows' draft-and-verify, and the prefilling rows' prompt chunks.

Decoding sequences are rows of one resident batch (`Batch`): each step the drafter (an MTP head
or a separate draft model, `mtpstack.worker.drafting`) proposes up to k tokens per row, the
target verifies every row in one forward, and each row keeps its own accepted prefix: attention
caches by length, recurrent state by the state saved after that position
(`mtpstack.worker.caches`). Drafted and accepted tokens are counted by position, and a request's
depth is honoured per row. Sequences whose prompts are going in are rows of the prefill batch
(`PrefillBatch`), a chunk of each per step in one forward; a row joins the decoding batch once
its first token is sampled.

Acceptance rule (documented in docs/worker.md): the target samples a token at
every verified position from its own distribution (argmax when greedy); a
drafted token is accepted when it equals the target's own sample there, and the
first disagreement emits the target's sample instead. Every emitted token is
therefore a sample of the target given the accepted prefix, so the output
distribution is exactly the target's (and greedy output is exactly the
target's greedy output) at every depth. The drafter always proposes its argmax,
the proposal most likely to match.
"""

from __future__ import annotations

import logging

import mlx.core as mx

from mtpstack.worker.caches import add_row, batch_caches, commit, filter_rows, prepare_chunk, take_row
from mtpstack.worker.depth_policy import DepthPolicy
from mtpstack.worker.drafting import Drafter
from mtpstack.worker.sequence import Sequence, StepResult, greedy_tokens
from mtpstack.worker.snapshots import Snapshots

log = logging.getLogger("mtpstack.worker")

#: One row's outcome of a step: its result, or the error that ended it.
RowOutcome = tuple[StepResult | None, BaseException | None]


class Batch:
    """The resident batch: one row per decoding sequence, in the target's and the drafter's caches."""

    def __init__(self, engine):
        self.engine = engine  # `mtpstack.worker.loading.Engine`
        self.caches = batch_caches(engine.cache_kinds)
        self.drafter: Drafter | None = engine.make_drafter()
        self.rows: list[Sequence] = []
        self.last_depth = 0  # the depth the last step ran at, and each row's own (`/metrics`)
        self.last_plans: list[int] = []

    def join(self, seq: Sequence, target: list[tuple], draft: list[tuple] | None) -> None:
        """A sequence whose prompt is in becomes a row, with its caches' rows (`caches.take_row`)."""
        add_row(self.caches, target)
        if self.drafter is not None:
            add_row(self.drafter.caches, draft)
            self.drafter.start(seq)
        seq.in_batch = True
        seq.carry = None  # the prompt's last hidden state: only the prefix cache needed it
        self.rows.append(seq)

    def remove_finished(self) -> None:
        keep = [i for i, seq in enumerate(self.rows) if not seq.finished]
        if len(keep) == len(self.rows):
            return
        filter_rows(self.caches, keep)
        if self.drafter is not None:
            self.drafter.filter(keep)
        for seq in self.rows:
            if seq.finished:
                seq.in_batch = False
        self.rows = [self.rows[i] for i in keep]

    @property
    def policy(self) -> DepthPolicy | None:
        """The worker's depth policy, where a row's depth is `auto` (made here for an engine built without one:
        it then measures each depth's cost from its first steps)."""
        engine = self.engine
        if getattr(engine, "depth_policy", None) is None and any(seq.adaptive for seq in self.rows):
            engine.depth_policy = DepthPolicy(engine.draft_depth, max(1, len(self.rows)))
        return getattr(engine, "depth_policy", None)

    def plans(self, depth: int | None = None) -> list[int]:
        """What each row drafts this step: its fixed depth, or for `auto` rows what the step's depth allows.
        `depth`: the step's depth decided elsewhere (rank 0's, on a distributed worker's other ranks);
        else the policy picks it from the rows' acceptance and the measured step costs."""
        if depth is None:
            depth = self.choose_depth()
        return [seq.plan(depth) for seq in self.rows]

    def choose_depth(self) -> int | None:
        """The next step's depth where a row's is `auto` (the policy's pick), else None: each row's own.
        Rank 0 of a distributed worker sends it to the others, whose rows then step alike."""
        rows = [seq for seq in self.rows if not seq.finished and not seq.cancelled]
        if not any(seq.adaptive for seq in rows):
            return None
        policy = self.policy
        caps = [seq.plan() for seq in rows]
        fixed = [None if seq.adaptive else cap for seq, cap in zip(rows, caps)]
        return policy.choose(caps, fixed, [policy.row_rates(seq) for seq in rows])

    def decode(self, depth: int | None = None) -> list[RowOutcome]:
        """One draft-and-verify step of every row: one target forward for the whole batch (`depth`: see `plans`).

        Each row's result, or the error its own work raised (its sampling hook, its output): such a
        row ends ("error") and the others' steps stand. An error of the shared forward is raised."""
        rows, engine = self.rows, self.engine
        plans = self.plans(depth)
        depth = max(plans)
        self.last_depth, self.last_plans = depth, plans
        inputs = mx.array([[seq.y] for seq in rows], dtype=mx.uint32)
        drafts = self.drafter.draft(rows, depth) if depth else None
        if drafts is not None and engine.agree is not None:
            drafts = engine.agree(drafts)
        if drafts is not None:
            inputs = mx.concatenate([inputs, drafts], axis=1)
        hidden = engine.parts.hidden(inputs, self.caches)
        logits = engine.parts.lm_head(hidden)
        proposed = drafts.tolist() if drafts is not None and any(seq.hook for seq in rows) else None
        errors: dict[int, BaseException] = {}
        # Rows that take the target's argmax as it is (greedy, no hook) are sampled in one op.
        plain = [seq.hook is None and seq.greedy for seq in rows]
        argmax = greedy_tokens(logits) if any(plain) else None
        picks = []
        for i, (seq, k) in enumerate(zip(rows, plans)):
            if plain[i]:
                picks.append(None)
                continue
            try:  # a request's own sampling hook (its grammar) may fail: that row alone
                picks.append(seq.sample(seq.hook.constrain(logits[i], proposed[i][:k] if proposed else []) if seq.hook else logits[i]))
            except Exception as e:
                errors[i] = e
                picks.append(greedy_tokens(logits[i]))  # a stand-in: the row leaves after this step
        sampled = argmax if all(plain) else mx.stack([argmax[i] if p is None else p for i, p in enumerate(picks)])
        if engine.agree is not None:
            # Rank 0's tokens on every rank, and which rows it failed (the last column), so they end everywhere.
            failed = mx.array([[int(i in errors)] for i in range(len(rows))], dtype=sampled.dtype)
            agreed = engine.agree(mx.concatenate([sampled, failed], axis=1))
            sampled = agreed[:, :-1]
            for i, flag in enumerate(agreed[:, -1].tolist()):
                if flag:
                    errors.setdefault(i, RuntimeError("rank 0 failed this row"))
        mx.eval(sampled, drafts if drafts is not None else [])
        s = sampled.tolist()
        d = drafts.tolist() if drafts is not None else [[] for _ in rows]
        accepted = []
        for i, (k, s_row, d_row) in enumerate(zip(plans, s, d)):
            n = 0
            while n < k and i not in errors and s_row[n] == d_row[n]:
                n += 1
            accepted.append(n)
        commit(self.caches, [n + 1 for n in accepted], depth + 1)
        if depth:
            self.drafter.accept(rows, depth, accepted, sampled, drafts, hidden)
        elif self.drafter is not None and any(seq.adaptive for seq in rows):
            self.drafter.skip(rows, sampled, hidden)  # the policy chose no draft: the drafter catches up later
        if depth and (policy := getattr(engine, "depth_policy", None)) is not None:
            for i, (seq, k, n) in enumerate(zip(rows, plans, accepted)):
                if i not in errors:
                    policy.observe_row(seq, k, n)
        # The kept states and the drafter's next proposals are computed while the rows' output is
        # written below, not waited for; the next step's work is built on them.
        mx.async_eval([c.state for c in self.caches], self.drafter.arrays(rows) if self.drafter is not None else [])
        results: list[RowOutcome] = []
        for i, (seq, k, n, s_row) in enumerate(zip(rows, plans, accepted, s)):
            try:
                if i in errors:
                    raise errors[i]
                seq.drafted += k
                seq.accepted += n
                emitted = seq.emit(s_row[: n + 1], logits[i] if seq.hook is not None else None)
                results.append((StepResult(drafted=k, accepted=n, tokens=emitted), None))
            except Exception as e:  # this row's own work failed: it ends, the others go on
                log.error("a row's step failed: %s: %s", type(e).__name__, e)
                seq.finish_reason = "error"
                results.append((None, e))
        return results


class PrefillBatch:
    """The rows whose prompts are being prefilled: one target forward (and one drafter forward) a step for all.

    Each row runs a chunk of its prompt per step, chunks of different lengths
    padded on the right (`caches`: attention rows keep their own lengths, the
    gated-delta layers skip padded positions). A row may start from a prefix
    cache hit. When its last chunk is in, its first token is sampled, the
    snapshots it took go into the prefix cache, and it moves to the decoding
    batch (`Batch.join`).
    """

    def __init__(self, engine, drafter: Drafter | None, snapshots: Snapshots):
        self.engine = engine  # `mtpstack.worker.loading.Engine`
        self.caches = batch_caches(engine.cache_kinds, prefill=True)
        self.drafter = drafter  # the decoding batch's drafter: the same module, its own prefill caches here
        self.draft_caches = drafter.prefill_caches() if drafter is not None else []
        self.snapshots = snapshots
        self.rows: list[Sequence] = []

    def admit(self, seq: Sequence) -> None:
        """A new row, resumed from the deepest prefix-cache snapshot its prompt begins with."""
        target, draft = self.snapshots.resume(seq)
        add_row(self.caches, target)
        add_row(self.draft_caches, draft)
        seq.prefilling = True
        self.rows.append(seq)

    def remove_finished(self) -> None:
        keep = [i for i, seq in enumerate(self.rows) if seq.prefilling and not seq.finished]
        if len(keep) == len(self.rows):
            return
        for seq in self.rows:
            if seq.finished:
                seq.prefilling = False
                self.snapshots.forget(seq)  # a prefill that did not complete leaves nothing behind
        filter_rows(self.caches, keep)
        filter_rows(self.draft_caches, keep)
        self.rows = [self.rows[i] for i in keep]

    def step(self, share: int, batch: Batch) -> list[tuple[Sequence, StepResult | None, BaseException | None]]:
        """One chunk of every row (at most `share` tokens each); rows whose prompt is in join `batch`."""
        engine, rows = self.engine, self.rows
        chunks = [seq.next_chunk(share, self.snapshots.taking(seq)) for seq in rows]
        lengths = [len(c) for c in chunks]
        width = max(lengths)
        hidden = None
        if width:
            ids = mx.array([c + [0] * (width - len(c)) for c in chunks], dtype=mx.uint32)
            prepare_chunk(self.caches, lengths)
            hidden = engine.parts.hidden(ids, self.caches)
            commit(self.caches, lengths, width)
        last = [hidden[r : r + 1, n - 1 : n] if n else seq.carry for r, (seq, n) in enumerate(zip(rows, lengths))]
        ending = [r for r, (seq, n) in enumerate(zip(rows, lengths)) if seq.completes_prompt(n)]
        finals, logits, errors = {}, {}, {}
        for r in ending:
            seq = rows[r]
            try:  # a request's own sampling hook (its grammar) may fail: that row alone
                logits[r] = engine.parts.lm_head(last[r][0])
                finals[r] = seq.sample(seq.hook.constrain(logits[r], []) if seq.hook else logits[r])
            except Exception as e:
                errors[r] = e
                finals.pop(r, None)
        if engine.agree is not None:
            self._agree_finals(finals, errors, ending)
        mx.eval(list(finals.values()))
        bonus = {r: int(t.item()) for r, t in finals.items()}
        carries = [seq.carry for seq in rows]
        if self.drafter is not None:
            self.drafter.prefill(self.draft_caches, rows, chunks, hidden, bonus, carries)
        for seq, h in zip(rows, last):
            seq.carry = h
        mx.eval([c.state for c in self.caches], [c.state for c in self.draft_caches], [seq.carry for seq in rows if seq.carry is not None],
                self.drafter.arrays(rows) if self.drafter is not None else [])
        results = []
        for r, (seq, n) in enumerate(zip(rows, lengths)):
            seq.advance_prefill(n)
            if r in errors:
                log.error("prefill of a row failed: %s: %s", type(errors[r]).__name__, errors[r])
                seq.finish_reason = "error"
                results.append((seq, None, errors[r]))
                continue
            self.snapshots.take(r, seq, self.caches, self.draft_caches, self.drafter)
            if r not in bonus:
                results.append((seq, StepResult(prefill=n), None))
                continue
            emitted = seq.emit([bonus[r]], logits[r])
            self.snapshots.store(seq)
            seq.prefilling = False
            if not seq.finished:
                batch.join(seq, take_row(self.caches, r), take_row(self.draft_caches, r))
            results.append((seq, StepResult(prefill=n, tokens=emitted), None))
        self.remove_finished()
        return results

    def _agree_finals(self, finals: dict, errors: dict, ending: list[int]) -> None:
        """Rank 0's first tokens for the rows whose prompt ended (-1 where it failed the row) on every rank."""
        if not ending:
            return
        mine = mx.concatenate([finals[r].reshape(-1).astype(mx.int32) if r in finals else mx.array([-1], dtype=mx.int32) for r in ending])
        for r, token in zip(ending, self.engine.agree(mine).tolist()):
            if token < 0:
                finals.pop(r, None)
                errors.setdefault(r, RuntimeError("rank 0 failed this row"))
            else:
                finals[r] = mx.array([token], dtype=mx.uint32)
