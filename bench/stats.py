"""The statistics behind every number the bench prints. Pure functions, no I/O.

Throughput on one machine moves a lot from run to run (the same model serving
byte-identical output has measured anywhere from 17.4 to 27.3 tok/s), so:

- a result is a set of passes, summarised as median ± MAD and min … max, with n;
- two configurations are compared by the ratio of their medians with a
  bootstrap confidence interval, never by a ratio of two single runs;
- a change is adopted only when the whole interval clears `1 + margin`, and
  nothing is compared at all with fewer than `MIN_PASSES` passes per side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: Fewer passes than this per side and no ratio is computed: with two values a
#: median is an average and the bootstrap interval collapses onto the data.
MIN_PASSES = 3
#: A change must beat the baseline by at least this share, with the whole interval.
DEFAULT_MARGIN = 0.05
DEFAULT_CONFIDENCE = 0.95
#: Bootstrap resamples for a decision; the interval's ends move by well under 1% between seeds.
DEFAULT_RESAMPLES = 4000
#: The sweep's passes per configuration and workload, chosen from `mtpstack bench simulate`
#: (table in docs/bench.md): at 10 passes the rule adopts a change that is not real in
#: well under 1% of experiments at any noise, and detects a real 15% win 93% of the time
#: when pass-to-pass CV is 5% (a quiet machine). At the 14% CV of a busy machine a 15% win
#: needs about 60 passes per side; the sweep then extends only configurations whose
#: verdict is still open, up to `DEFAULT_MAX_REPEATS`, and the report says how many more
#: passes the measured spread calls for.
DEFAULT_REPEATS = 10
DEFAULT_MAX_REPEATS = 30
#: Relative MAD above which a result gets a warning: the run-to-run noise this
#: high hides changes of the size a draft depth makes.
SPREAD_WARN = 0.05
#: Keeps one bootstrap batch under about 50 MB of indices.
_BATCH_ELEMENTS = 6_000_000

Decision = Literal["adopt", "not significant", "too few passes"]


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    mad: float
    min: float
    max: float

    @property
    def rel_mad(self) -> float:
        """MAD as a share of the median (0 when the median is 0)."""
        return self.mad / self.median if self.median else 0.0

    @property
    def rel_range(self) -> float:
        """(max - min) as a share of the median."""
        return (self.max - self.min) / self.median if self.median else 0.0


def median(values: Sequence[float]) -> float:
    if len(values) == 0:
        raise ValueError("the median of no values is undefined")
    return float(np.median(np.asarray(values, dtype=float)))


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median (raw, not scaled to a standard deviation)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("the MAD of no values is undefined")
    return float(np.median(np.abs(arr - np.median(arr))))


def summarize(values: Sequence[float]) -> Summary:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("cannot summarise no values")
    return Summary(n=int(arr.size), median=median(arr), mad=mad(arr), min=float(arr.min()), max=float(arr.max()))


def _batch_ratio_ci(
    base: np.ndarray, cand: np.ndarray, confidence: float, resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of median(cand)/median(base), row by row.

    `base` is (T, n), `cand` is (T, m); returns (lo, hi), each of shape (T,).
    One implementation serves both a single decision (T = 1) and the simulation,
    so the simulation measures exactly the rule the sweep applies.
    """
    t, n = base.shape
    m = cand.shape[1]
    alpha = (1.0 - confidence) / 2.0
    lo = np.empty(t)
    hi = np.empty(t)
    step = max(1, _BATCH_ELEMENTS // (resamples * max(n, m)))
    for start in range(0, t, step):
        rows = slice(start, min(t, start + step))
        b = base[rows]
        c = cand[rows]
        k = b.shape[0]
        pick = np.arange(k)[:, None, None]
        mb = np.median(b[pick, rng.integers(0, n, size=(k, resamples, n))], axis=2)
        mc = np.median(c[pick, rng.integers(0, m, size=(k, resamples, m))], axis=2)
        ratio = mc / mb
        lo[rows], hi[rows] = np.quantile(ratio, [alpha, 1.0 - alpha], axis=1)
    return lo, hi


def ratio_ci(
    base: Sequence[float],
    cand: Sequence[float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int | None = 0,
) -> tuple[float, float, float]:
    """(ratio of medians cand/base, interval low, interval high). Fixed seed by default, so a
    report rendered twice from the same results file says the same thing."""
    b = np.asarray(base, dtype=float)
    c = np.asarray(cand, dtype=float)
    if b.size < 1 or c.size < 1:
        raise ValueError("both sides need at least one value")
    rng = np.random.default_rng(seed)
    lo, hi = _batch_ratio_ci(b[None, :], c[None, :], confidence, resamples, rng)
    return float(np.median(c) / np.median(b)), float(lo[0]), float(hi[0])


@dataclass(frozen=True)
class Verdict:
    """The answer to "should cand replace base?" under the decision rule."""

    decision: Decision
    n_base: int
    n_cand: int
    margin: float
    ratio: float | None = None
    lo: float | None = None
    hi: float | None = None

    @property
    def adopt(self) -> bool:
        return self.decision == "adopt"

    @property
    def open(self) -> bool:
        """More passes could still turn this into "adopt": the threshold lies inside the
        interval and the point estimate is a win. A change that looks slower is not chased."""
        if self.decision != "not significant" or self.lo is None or self.hi is None or self.ratio is None:
            return False
        return self.lo <= 1.0 + self.margin < self.hi and self.ratio > 1.0


def decide(
    base: Sequence[float],
    cand: Sequence[float],
    *,
    margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int | None = 0,
) -> Verdict:
    """Adopt `cand` only when the whole bootstrap interval of the ratio of medians clears
    `1 + margin`; refuse to compare with fewer than `MIN_PASSES` passes on either side."""
    nb, nc = len(base), len(cand)
    if nb < MIN_PASSES or nc < MIN_PASSES:
        return Verdict("too few passes", nb, nc, margin)
    ratio, lo, hi = ratio_ci(base, cand, confidence=confidence, resamples=resamples, seed=seed)
    decision: Decision = "adopt" if lo > 1.0 + margin else "not significant"
    return Verdict(decision, nb, nc, margin, ratio, lo, hi)


def decide_batch(
    base: np.ndarray,
    cand: np.ndarray,
    *,
    margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = 1000,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`decide` for T independent pairs at once (rows of `base` and `cand`), for the
    simulation. Returns (adopt, open, ratio) arrays of shape (T,)."""
    if base.shape[1] < MIN_PASSES or cand.shape[1] < MIN_PASSES:
        t = base.shape[0]
        return np.zeros(t, bool), np.zeros(t, bool), np.full(t, np.nan)
    lo, hi = _batch_ratio_ci(base, cand, confidence, resamples, rng)
    ratio = np.median(cand, axis=1) / np.median(base, axis=1)
    threshold = 1.0 + margin
    adopt = lo > threshold
    still_open = ~adopt & (lo <= threshold) & (hi > threshold) & (ratio > 1.0)
    return adopt, still_open, ratio


@dataclass(frozen=True)
class Candidate:
    """One configuration's passes for the depth recommendation."""

    label: str
    depth: int | str | None  # None: no drafter; "auto": the worker's adaptive depth
    values: tuple[float, ...]

    @property
    def order(self) -> tuple[int, int]:
        """Simplest first: no drafter, then each depth by size, then `auto`."""
        if self.depth is None:
            return (0, 0)
        return (1, self.depth) if isinstance(self.depth, int) else (2, 0)


def recommend(
    baseline: Candidate,
    candidates: Sequence[Candidate],
    *,
    margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int | None = 0,
    paired: bool = False,
) -> Candidate | None:
    """The configuration to run: the smallest depth whose result is within noise of the best.

    Only the baseline and the candidates adopted against it are eligible; the baseline
    comes first (keeping the default wins every tie). "Within noise of the best" uses the
    decision rule itself: the best does not beat it by the margin with its whole interval.
    None when any eligible configuration has fewer than `MIN_PASSES` passes.
    """
    everyone = [baseline, *candidates]
    if any(len(c.values) < MIN_PASSES for c in everyone):
        return None
    kw = dict(margin=margin, confidence=confidence, resamples=resamples, seed=seed)
    # Paired passes (an alternated sweep): pass i of every configuration ran in the same round.
    rule = decide_paired if paired else decide
    adopted = [c for c in candidates if rule(baseline.values, c.values, **kw).adopt]
    eligible = [baseline] + sorted(adopted, key=lambda c: c.order)
    best = max(everyone, key=lambda c: median(c.values))
    for c in eligible:
        if c is best or not rule(c.values, best.values, **kw).adopt:
            return c
    return baseline  # unreachable: `best` is eligible whenever no one else is within noise



@dataclass(frozen=True)
class Settling:
    """The comparison that settles a recommendation: the best configuration against the one recommended
    (the smallest within noise of it). `verdict` is None when the recommendation is the best itself."""

    recommended: Candidate
    best: Candidate
    verdict: Verdict | None

    @property
    def decided(self) -> bool:
        """The interval of best/recommended lies wholly above or wholly below `1 + margin`."""
        v = self.verdict
        if v is None:
            return True
        if v.lo is None or v.hi is None:
            return False
        threshold = 1.0 + v.margin
        return v.lo > threshold or v.hi < threshold


def settling(
    baseline: Candidate, candidates: Sequence[Candidate], *, margin: float = DEFAULT_MARGIN, seed: int | None = 0,
    resamples: int = DEFAULT_RESAMPLES, paired: bool = False,
) -> Settling | None:
    """`recommend`'s answer with the comparison it rests on; None when `recommend` refuses."""
    rec = recommend(baseline, candidates, margin=margin, seed=seed, resamples=resamples, paired=paired)
    if rec is None:
        return None
    best = max([baseline, *candidates], key=lambda c: median(c.values))
    if best is rec:
        return Settling(rec, best, None)
    rule = decide_paired if paired else decide
    return Settling(rec, best, rule(rec.values, best.values, margin=margin, seed=seed, resamples=resamples))

# -- paired passes -----------------------------------------------------------------------
#: Fewer pairs than this and the paired rule refuses: a bootstrap over 3 pairs is too narrow and
#: adopts a change that is not real about 6% of the time (`mtpstack bench simulate --design paired`).
MIN_PAIRS = 5
# A pass is one pair: the two configurations run back to back (in alternating order, AB then BA),
# so slow drift shared by neighbouring runs cancels in the pair's ratio. The statistic is the
# geometric mean of the per-pair ratios, with a bootstrap over pairs; the rule is unchanged:
# adopt only when the whole interval clears `1 + margin`.


def paired_ci_batch(
    base: np.ndarray, cand: np.ndarray, *, confidence: float = DEFAULT_CONFIDENCE, resamples: int = 1000,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lo, hi) of the geometric mean of cand/base pair by pair, for T rows of n pairs each."""
    logs = np.log(cand) - np.log(base)
    t, n = logs.shape
    alpha = (1.0 - confidence) / 2.0
    lo = np.empty(t)
    hi = np.empty(t)
    step = max(1, _BATCH_ELEMENTS // (resamples * n))
    for start in range(0, t, step):
        rows = slice(start, min(t, start + step))
        block = logs[rows]
        k = block.shape[0]
        means = block[np.arange(k)[:, None, None], rng.integers(0, n, size=(k, resamples, n))].mean(axis=2)
        lo[rows], hi[rows] = np.quantile(means, [alpha, 1.0 - alpha], axis=1)
    return np.exp(logs.mean(axis=1)), np.exp(lo), np.exp(hi)


def decide_paired_batch(
    base: np.ndarray, cand: np.ndarray, *, margin: float = DEFAULT_MARGIN, confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = 1000, rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`decide_batch` for paired passes (column i of `base` and `cand` is one pair). Returns
    (adopt, open, ratio); open: the interval still straddles `1 + margin` (decided means wholly
    above or wholly below it)."""
    t, n = base.shape
    if n < MIN_PAIRS:
        return np.zeros(t, bool), np.zeros(t, bool), np.full(t, np.nan)
    ratio, lo, hi = paired_ci_batch(base, cand, confidence=confidence, resamples=resamples, rng=rng)
    threshold = 1.0 + margin
    adopt = lo > threshold
    return adopt, ~adopt & (hi > threshold), ratio


def decide_paired(
    base: Sequence[float], cand: Sequence[float], *, margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0,
) -> Verdict:
    """`decide` for paired passes: `base[i]` and `cand[i]` ran back to back."""
    if len(base) != len(cand):
        raise ValueError(f"paired passes need as many of each: {len(base)} and {len(cand)}")
    n = len(base)
    if n < MIN_PAIRS:
        return Verdict("too few passes", n, n, margin)
    rng = np.random.default_rng(seed)
    b = np.asarray(base, dtype=float)[None, :]
    c = np.asarray(cand, dtype=float)[None, :]
    ratio, lo, hi = paired_ci_batch(b, c, confidence=confidence, resamples=resamples, rng=rng)
    decision: Decision = "adopt" if lo[0] > 1.0 + margin else "not significant"
    return Verdict(decision, n, n, margin, float(ratio[0]), float(lo[0]), float(hi[0]))


def neighbour_correlation(labels: Sequence[str], values: Sequence[float]) -> float | None:
    """The drift correlation between neighbouring runs of an alternated run (runs in time order):
    the lag-1 autocorrelation of log throughput after removing each configuration's own mean.
    None with fewer than 4 runs or no spread."""
    if len(labels) != len(values) or len(values) < 4:
        return None
    logs = np.log(np.asarray(values, dtype=float))
    resid = logs.copy()
    for label in set(labels):
        mask = np.array([x == label for x in labels])
        resid[mask] -= logs[mask].mean()
    var = float(np.mean(resid * resid))
    if var == 0.0:
        return None
    return float(np.mean(resid[1:] * resid[:-1]) / var)


# -- percentiles and clustered samples ---------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0-100): a value that was measured, never an interpolation; NaN of no values."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = max(0, min(len(v) - 1, math.ceil(q / 100 * len(v)) - 1))
    return v[k]


def cluster_ratio_ci(
    base: Sequence[Sequence[float]],
    cand: Sequence[Sequence[float]],
    statistic: Callable[[Sequence[float]], float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int | None = 0,
) -> tuple[float, float, float]:
    """(statistic(cand) / statistic(base), interval low, interval high) over pooled values, the interval
    from a percentile bootstrap that resamples whole clusters on each side (e.g. one agent session's
    turns): values within a cluster share its load and its cache, so resampling them one by one would
    claim more certainty than the run has. Empty clusters are dropped; each side needs one value."""
    b = [list(c) for c in base if len(c)]
    c = [list(x) for x in cand if len(x)]
    if not b or not c:
        raise ValueError("both sides need at least one value")
    rng = np.random.default_rng(seed)
    point = statistic([v for x in c for v in x]) / statistic([v for x in b for v in x])
    ratios = np.empty(resamples)
    for i in range(resamples):
        rb = [v for k in rng.integers(0, len(b), len(b)) for v in b[k]]
        rc = [v for k in rng.integers(0, len(c), len(c)) for v in c[k]]
        ratios[i] = statistic(rc) / statistic(rb)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
    return float(point), float(lo), float(hi)
