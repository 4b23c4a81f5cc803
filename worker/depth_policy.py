"""Adaptive draft depth (`--draft-depth auto`): each step drafts as deep as its rows' live acceptance pays for.

A verify step at depth k costs `cost(w, k)` seconds at batch width w, and a row drafting k tokens
emits `E(k) = 1 + p1 + p1 p2 + ... + p1...pk` tokens on average, where `pj` is the chance that the
j-th drafted token is accepted once the ones before it were. So the best depth is the one with the
most expected tokens per second, `sum over rows E_row(k) / cost(w, k)`, and it is 0 (plain decoding)
when the head does not pay for its own step. Both sides are measured, not assumed:

- acceptance, per row: a decaying count of drafted and accepted tokens per draft position
  (`Acceptance`), so a row that turns from prose to code or to a tool call's JSON follows within a
  few steps; a new row starts from the worker's own pooled estimate, which also regresses slowly
  toward the position before it where nothing was drafted lately, so a depth not tried for a while
  is tried again;
- cost, per worker: the seconds of a verify step at each width and depth, measured at start
  (`depth_calibration.calibrate`, a few steps of every depth at the narrowest and widest batch) and kept current
  from every live step (`StepCosts`), which also carries a change of level (a longer context) over
  to the depths not run lately.

The batch runs one forward for all its rows, so a step has one depth: rows drafting less ride along
in it at no cost to the others. The step's depth is chosen for the batch's total expected tokens per
second; a row drafts that depth or less (its own cap, what is left of its `max_tokens`), and a row
with a fixed depth (a request's `num_draft_tokens`, a class with an integer depth) keeps it, the
step never going below it. While depth 0 wins, one step in `PROBE_EVERY` drafts one token, so a
head that starts to pay again is seen. The output is the target's at every depth (`mtpstack.worker.batch`):
the policy changes only the speed.
"""

from __future__ import annotations

import logging

log = logging.getLogger("mtpstack.worker")

#: Weight each earlier observation keeps when a row's step is counted (about the last 10 steps matter).
ROW_DECAY = 0.9
#: The same for the worker's pooled estimate, which every row's steps feed (a few hundred row-steps).
POOL_DECAY = 0.995
#: Observations' worth of the pooled estimate a row's own estimate starts from.
PRIOR_WEIGHT = 3.0
#: The acceptance assumed before any token was drafted: enough for the first steps to draft and measure.
INITIAL_ACCEPTANCE = 0.6
#: While depth 0 wins, one step in this many drafts one token to keep measuring the head.
PROBE_EVERY = 16
#: Weight of a new measurement in a cell of the cost table, and the share of its change carried to
#: the other depths of the same width.
COST_SMOOTHING = 0.2
COST_CARRY = 0.5

class Acceptance:
    """Decaying counts of drafted and accepted tokens at each draft position (1-based as in `/metrics`)."""

    def __init__(self, max_depth: int, decay: float):
        self.decay = decay
        self.tried = [0.0] * max_depth
        self.hit = [0.0] * max_depth

    def observe(self, drafted: int, accepted: int) -> None:
        """A step that drafted `drafted` tokens, of which the first `accepted` were taken: positions up to the
        first rejection were tried, the ones after it were not (they say nothing of their own rate)."""
        d = self.decay
        for j in range(len(self.tried)):
            self.tried[j] *= d
            self.hit[j] *= d
        for j in range(min(accepted + 1, drafted, len(self.tried))):
            self.tried[j] += 1.0
            self.hit[j] += 1.0 if j < accepted else 0.0

    def rates(self, prior: list[float], weight: float) -> list[float]:
        """The conditional acceptance per position: these counts over `prior`'s worth of `weight` observations."""
        return [(h + weight * p) / (t + weight) for h, t, p in zip(self.hit, self.tried, prior)]


class Pool(Acceptance):
    """The worker's estimate from every row's steps: a new row's prior. A position drafted rarely leans on
    the one before it (acceptance falls with depth, so that is the hopeful side and gets it tried)."""

    def __init__(self, max_depth: int):
        super().__init__(max_depth, POOL_DECAY)

    def prior(self) -> list[float]:
        out, before = [], INITIAL_ACCEPTANCE
        for h, t in zip(self.hit, self.tried):
            before = (h + before) / (t + 1.0)
            out.append(before)
        return out


def expected_tokens(rates: list[float], depth: int) -> float:
    """Tokens a step at `depth` emits on average: the target's own one plus each draft accepted in turn."""
    total, reach = 1.0, 1.0
    for p in rates[:depth]:
        reach *= p
        total += reach
    return total


class StepCosts:
    """Seconds of one verify step (draft and verify of every row) by batch width and depth."""

    def __init__(self, max_width: int, max_depth: int):
        self.max_width, self.max_depth = max_width, max_depth
        self.cells: dict[tuple[int, int], float] = {}
        self.measured: dict[tuple[int, int], int] = {}  # live steps counted per cell

    def seed(self, width: int, depth: int, seconds: float) -> None:
        self.cells[width, depth] = seconds

    def observe(self, width: int, depth: int, seconds: float) -> None:
        old = self.cost(width, depth)
        self.measured[width, depth] = self.measured.get((width, depth), 0) + 1
        if old is None:
            self.cells[width, depth] = seconds
            return
        self.cells[width, depth] = (1 - COST_SMOOTHING) * old + COST_SMOOTHING * seconds
        # The same change of level (a longer context, a busier machine) for the depths not run lately.
        scale = 1 + COST_SMOOTHING * COST_CARRY * (seconds / old - 1)
        for (w, d), value in list(self.cells.items()):
            if w == width and d != depth:
                self.cells[w, d] = value * scale

    def cost(self, width: int, depth: int) -> float | None:
        """The cell, else interpolated in width between the nearest measured widths at this depth."""
        if (width, depth) in self.cells:
            return self.cells[width, depth]
        widths = sorted(w for w, d in self.cells if d == depth)
        if not widths:
            return None
        below = [w for w in widths if w < width]
        above = [w for w in widths if w > width]
        if below and above:
            lo, hi = below[-1], above[0]
            a, b = self.cells[lo, depth], self.cells[hi, depth]
            return a + (b - a) * (width - lo) / (hi - lo)
        nearest = below[-1] if below else above[0]
        return self.cells[nearest, depth]

    def table(self, width: int) -> dict[int, float]:
        """The known cost of every depth at this width."""
        out = {}
        for d in range(self.max_depth + 1):
            c = self.cost(width, d)
            if c is not None:
                out[d] = c
        return out


class DepthPolicy:
    """Picks each step's depth for the rows of a batch (`Batch.decode`); one per worker."""

    def __init__(self, max_depth: int, max_width: int, costs: StepCosts | None = None):
        self.max_depth = max_depth
        self.pool = Pool(max_depth)
        self.costs = costs or StepCosts(max_width, max_depth)
        self.zero_steps = 0  # steps in a row that chose depth 0
        self.last: dict = {}  # the last choice and what it was made of, for `/metrics`
        self.chosen: dict[int, int] = {}  # steps run at each depth by this policy

    def row_rates(self, seq) -> list[float]:
        own = getattr(seq, "acceptance", None)
        prior = self.pool.prior()
        return prior if own is None else own.rates(prior, PRIOR_WEIGHT)

    def choose(self, caps: list[int], fixed: list[int | None], rates: list[list[float]]) -> int:
        """The step's depth for rows whose own caps are `caps` (what each may draft), `fixed` a row's fixed depth
        (None where it is adaptive), `rates` each row's acceptance estimate."""
        width = len(caps)
        floor = max([f for f in fixed if f is not None], default=0)
        top = max([floor, *(c for c, f in zip(caps, fixed) if f is None)])
        table = self.costs.table(width)
        best, best_rate, scores = floor, -1.0, {}
        for depth in range(floor, top + 1):
            cost = table.get(depth)
            if cost is None or cost <= 0:
                # Never measured at this width or any other: the step is run once to measure it.
                best, scores = depth, {**scores, depth: None}
                break
            tokens = sum(expected_tokens(r, f if f is not None else min(depth, c)) for r, c, f in zip(rates, caps, fixed))
            scores[depth] = tokens / cost
            if tokens / cost > best_rate * 1.0001:  # a tie goes to the shallower depth
                best, best_rate = depth, tokens / cost
        if best == 0 and top > 0:
            self.zero_steps += 1
            if self.zero_steps % PROBE_EVERY == 0:
                best = 1
        else:
            self.zero_steps = 0
        self.chosen[best] = self.chosen.get(best, 0) + 1
        self.last = {"depth": best, "width": width, "scores": scores}
        return best

    def observe_row(self, seq, drafted: int, accepted: int) -> None:
        """A row's step: its own estimate and the pool learn what its drafts did."""
        if drafted <= 0:
            return
        own = getattr(seq, "acceptance", None)
        if own is None:
            own = seq.acceptance = Acceptance(self.max_depth, ROW_DECAY)
            # Start from the pool's view, as PRIOR_WEIGHT observations would.
        own.observe(drafted, accepted)
        self.pool.observe(drafted, accepted)

    def observe_step(self, width: int, depth: int, seconds: float) -> None:
        self.costs.observe(width, depth, seconds)

    def describe(self, width: int | None = None) -> dict:
        """What `/metrics` and the fleet view show: the pooled acceptance per position, the cost per depth
        at the last step's width, and the last choice."""
        w = width or self.last.get("width") or 1
        return {
            "acceptance": self.pool.prior(),
            "cost": self.costs.table(w),
            "depth": self.last.get("depth"),
            "width": w,
        }
