"""Adaptive draft depth (`--draft-depth auto`, `mtpstack.worker.depth_policy`): the policy's arithmetic on
numbers chosen here, then on the demo pair: greedy output unchanged whatever depths the policy picks, and a
head that went past positions without drafting proposes what it would have had it seen every one."""

from __future__ import annotations

import pytest

from mtpstack.worker.depth_calibration import calibrate
from mtpstack.worker.depth_policy import (
    PROBE_EVERY,
    Acceptance,
    DepthPolicy,
    Pool,
    StepCosts,
    expected_tokens,
)


def costs_of(table: dict[int, float], width: int = 1, max_depth: int | None = None) -> StepCosts:
    costs = StepCosts(width, max_depth or max(table))
    for depth, seconds in table.items():
        costs.seed(width, depth, seconds)
    return costs


def test_expected_tokens_counts_each_draft_accepted_in_turn():
    assert expected_tokens([0.5, 0.5], 0) == 1
    assert expected_tokens([0.5, 0.5], 1) == 1.5
    assert expected_tokens([0.5, 0.5], 2) == 1.75
    assert expected_tokens([1.0, 1.0, 1.0], 3) == 4


def test_a_step_counts_the_positions_up_to_its_first_rejection():
    acc = Acceptance(4, decay=1.0)
    acc.observe(drafted=4, accepted=1)  # position 1 taken, 2 refused, 3 and 4 never reached
    assert acc.tried == [1, 1, 0, 0] and acc.hit == [1, 0, 0, 0]
    acc.observe(drafted=2, accepted=2)  # both taken; nothing said of 3
    assert acc.tried == [2, 2, 0, 0] and acc.hit == [2, 1, 0, 0]
    assert acc.rates([0.5] * 4, weight=2.0) == [0.75, 0.5, 0.5, 0.5]


def test_a_row_follows_a_change_of_acceptance_within_a_few_steps():
    acc = Acceptance(2, decay=0.9)
    for _ in range(50):
        acc.observe(2, 2)
    assert acc.rates([0.5, 0.5], 3.0)[0] > 0.85  # about the last 10 steps, beside 3 of the prior
    for _ in range(10):
        acc.observe(2, 0)
    assert acc.rates([0.5, 0.5], 3.0)[0] < 0.5


def test_the_pool_leans_a_position_not_drafted_lately_on_the_one_before():
    pool = Pool(3)
    for _ in range(200):
        pool.observe(1, 1)  # only depth 1 runs, and pays
    prior = pool.prior()
    assert prior[0] > 0.9
    assert prior[1] == pytest.approx(prior[0]) and prior[2] == pytest.approx(prior[0])


def test_the_depth_with_the_most_tokens_per_second_wins():
    policy = DepthPolicy(4, 1, costs_of({0: 1.0, 1: 1.2, 2: 1.4, 3: 1.6, 4: 2.4}))
    good = [0.9, 0.9, 0.9, 0.9]
    # E(k)/cost: 1.0, 1.58, 1.94, 2.15, 1.71
    assert policy.choose([4], [None], [good]) == 3
    # The same head, a cheaper depth 4: 4.10 / 1.8 = 2.28 beats it.
    policy.costs.seed(1, 4, 1.8)
    assert policy.choose([4], [None], [good]) == 4
    assert policy.last["scores"][3] == pytest.approx(expected_tokens(good, 3) / 1.6)


def test_a_head_that_does_not_pay_is_not_run_but_is_probed():
    policy = DepthPolicy(4, 1, costs_of({0: 1.0, 1: 1.5, 2: 2.0, 3: 2.5, 4: 3.0}))
    bad = [0.2, 0.2, 0.2, 0.2]
    picks = [policy.choose([4], [None], [bad]) for _ in range(4 * PROBE_EVERY)]
    assert picks.count(1) == 4 and set(picks) == {0, 1}
    assert all(p == 1 for i, p in enumerate(picks) if (i + 1) % PROBE_EVERY == 0)


def test_a_fixed_row_keeps_its_depth_and_the_step_never_goes_below_it():
    policy = DepthPolicy(4, 2, costs_of({0: 1.0, 1: 1.5, 2: 2.0, 3: 2.5, 4: 3.0}, width=2))
    bad = [0.1] * 4
    assert policy.choose([4, 3], [None, 3], [bad, bad]) == 3
    # A row's own cap (its max_tokens left) bounds it, not the others: the good row alone pays for depth 4.
    cheap = DepthPolicy(4, 2, costs_of({0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4}, width=2))
    good = [0.99] * 4
    assert cheap.choose([1, 4], [None, None], [good, good]) == 4  # (1.99 + 4.90) / 1.4 against 3.98 / 1.1


def test_an_unmeasured_depth_is_run_once_to_measure_it():
    policy = DepthPolicy(3, 1, costs_of({0: 1.0, 1: 1.1}, max_depth=3))
    assert policy.choose([3], [None], [[0.9] * 3]) == 2
    policy.observe_step(1, 2, 1.2)
    assert policy.choose([3], [None], [[0.9] * 3]) == 3


def test_the_cost_table_follows_live_steps_and_carries_a_level_change_to_other_depths():
    costs = costs_of({0: 1.0, 1: 2.0})
    for _ in range(30):
        costs.observe(1, 0, 2.0)  # depth 0 got twice as slow (a longer context)
    assert costs.cost(1, 0) == pytest.approx(2.0, rel=0.01)
    assert costs.cost(1, 1) > 2.5  # depth 1, not run, follows part of the way


def test_a_width_never_measured_is_interpolated_between_its_neighbours():
    costs = StepCosts(4, 1)
    costs.seed(1, 1, 1.0)
    costs.seed(4, 1, 4.0)
    assert costs.cost(2, 1) == pytest.approx(2.0)
    assert costs.cost(3, 0) is None


# -- on the demo pair ---------------------------------------------------------------------------


class Scripted(DepthPolicy):
    """The real policy's bookkeeping, with the step's depth taken from a script (to reach every switch)."""

    def __init__(self, script: list[int], max_depth: int, width: int):
        super().__init__(max_depth, width)
        self.script, self.steps = script, 0

    def choose(self, caps, fixed, rates):
        depth = self.script[self.steps % len(self.script)]
        self.steps += 1
        return depth


@pytest.fixture(scope="module")
def demo_engine():
    from mtpstack.worker.loading import Engine
    from tests.worker.greedy import plain_greedy
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    engine = Engine.load(str(DEMO_TARGET), str(DEMO_HEAD), draft_depth=4)
    return engine, plain_greedy(engine, 48)


def run(engine, prompts, *, depth, auto, policy=None, max_tokens=48):
    from mtpstack.worker.scheduler import Scheduler
    from mtpstack.worker.sequence import SamplingParams

    engine.depth_policy = policy
    sched = Scheduler(max_num_seqs=len(prompts))
    seqs = [engine.new_sequence(engine.text_prompt(p), SamplingParams(max_tokens=max_tokens, depth=depth, auto=auto, ignore_eos=True))
            for p in prompts]
    for seq in seqs:
        sched.add(seq)
    proposals: list[dict[int, int]] = [{} for _ in seqs]
    drafter = sched.batch.drafter
    inner_draft = drafter.draft

    def draft(rows, k):  # records each row's first proposal by the position it proposes for
        out = inner_draft(rows, k)
        for seq, first in zip(rows, out[:, 0].tolist()):
            proposals[seqs.index(seq)][len(seq.tokens)] = first
        return out

    drafter.draft = draft
    depths = []
    while sched.active:
        sched.step()
        if sched.batch.rows or sched.decode_steps:
            depths.append(sched.batch.last_depth)
    engine.depth_policy = None
    return [seq.tokens for seq in seqs], proposals, depths


@pytest.mark.parametrize("width", [1, 4])
def test_greedy_output_is_the_targets_whatever_depths_the_policy_picks(demo_engine, width):
    from tests.worker.greedy import PROMPTS

    engine, reference = demo_engine
    prompts = PROMPTS[:width]
    script = [0, 0, 3, 1, 0, 4, 2, 0, 0, 0, 1]
    tokens, _, depths = run(engine, prompts, depth=4, auto=True, policy=Scripted(script, 4, width))
    assert tokens == [reference[p] for p in prompts]
    assert {0, 1, 2, 3, 4} <= set(depths)
    # The real policy, calibrated on this machine, on the same rows.
    costs = calibrate(engine, width, 4)
    tokens, _, _ = run(engine, prompts, depth=4, auto=True, policy=DepthPolicy(4, width, costs))
    assert tokens == [reference[p] for p in prompts]


def test_a_head_that_skipped_positions_proposes_as_if_it_had_seen_them(demo_engine):
    from tests.worker.greedy import PROMPTS

    engine, _ = demo_engine
    prompts = PROMPTS[:2]
    _, always, _ = run(engine, prompts, depth=1, auto=False, max_tokens=120)
    script = [0, 0, 0, 0, 1]  # four steps past the head, then a draft
    tokens, caught_up, depths = run(engine, prompts, depth=1, auto=True, policy=Scripted(script, 1, 2), max_tokens=120)
    assert depths.count(0) > depths.count(1) > 2
    pairs = [(always[r][pos], first) for r in range(len(prompts)) for pos, first in caught_up[r].items() if pos in always[r]]
    assert len(pairs) >= 20
    same = sum(a == b for a, b in pairs)
    assert same >= 0.9 * len(pairs), pairs


def test_a_stretch_without_drafting_is_caught_up_before_it_grows_past_its_bound(demo_engine):
    from mtpstack.worker.drafting import MAX_BEHIND
    from mtpstack.worker.scheduler import Scheduler
    from mtpstack.worker.sequence import SamplingParams

    engine, _ = demo_engine
    engine.depth_policy = Scripted([0], 1, 1)
    try:
        sched = Scheduler(1)
        seq = engine.new_sequence(engine.text_prompt("def main():"), SamplingParams(max_tokens=MAX_BEHIND * 2 + 10, depth=1, auto=True, ignore_eos=True))
        sched.add(seq)
        longest = 0
        while sched.active:
            sched.step()
            if seq.in_batch:
                longest = max(longest, len(seq.draft.behind))
        assert 0 < longest < MAX_BEHIND
    finally:
        engine.depth_policy = None
