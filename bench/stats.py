"""The statistics behind every number the bench prints (pure). One machine serving byte-identical output
measured 17.4 to 27.3 tok/s, so a result is a set of passes (median ± MAD, min … max, n), two configurations
are compared by a bootstrap interval of their ratio, never by two single runs, and a change is adopted only
when the whole interval clears `1 + margin`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: Fewer passes per side and no ratio is computed: with two values the bootstrap interval collapses onto the data.
MIN_PASSES = 3
#: Fewer pairs (AB then BA, so shared drift cancels) and the paired rule refuses: over 3 pairs it adopts a change
#: that is not real about 6% of the time (`mtpstack bench simulate --design paired`).
MIN_PAIRS = 5
#: A change must beat the baseline by at least this share, with the whole interval.
DEFAULT_MARGIN = 0.05
DEFAULT_CONFIDENCE = 0.95
#: Bootstrap resamples for a decision; the interval's ends move by well under 1% between seeds.
DEFAULT_RESAMPLES = 4000
#: The sweep's passes, from `mtpstack bench simulate` (docs/bench.md): at 10 the rule is fooled well under 1% of
#: the time and detects a 15% win 93% of the time at 5% CV; 14% CV needs about 60, so only open verdicts extend.
DEFAULT_REPEATS = 10
DEFAULT_MAX_REPEATS = 30
#: Relative MAD above which a result gets a warning: noise this high hides what a draft depth changes.
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
        return self.mad / self.median if self.median else 0.0

    @property
    def rel_range(self) -> float:
        return (self.max - self.min) / self.median if self.median else 0.0


def median(values: Sequence[float]) -> float:
    if len(values) == 0:
        raise ValueError("the median of no values is undefined")
    return float(np.median(np.asarray(values, dtype=float)))


def summarize(values: Sequence[float]) -> Summary:
    """The MAD raw, not scaled to a standard deviation."""
    arr = np.asarray(values, dtype=float)
    mid = median(arr)
    return Summary(n=arr.size, median=mid, mad=float(np.median(np.abs(arr - mid))), min=float(arr.min()),
                   max=float(arr.max()))


def _resampled(x: np.ndarray, rows: slice, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`resamples` bootstrap draws of each row of `x[rows]`: shape (rows, resamples, n)."""
    block = x[rows]
    k, n = block.shape
    return block[np.arange(k)[:, None, None], rng.integers(0, n, size=(k, resamples, n))]


def _interval(t: int, width: int, resamples: int, confidence: float, draws) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of T rows, in batches; `draws(rows)`: (rows, resamples) statistics. One
    decision is T = 1, so the simulation measures exactly the rule the sweep applies."""
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.empty(t), np.empty(t)
    step = max(1, _BATCH_ELEMENTS // (resamples * width))
    for start in range(0, t, step):
        rows = slice(start, min(t, start + step))
        lo[rows], hi[rows] = np.quantile(draws(rows), [alpha, 1.0 - alpha], axis=1)
    return lo, hi


def _batch(base: np.ndarray, cand: np.ndarray, confidence: float, resamples: int, rng,
           paired: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ratio, lo, hi) row by row, `base` (T, n) and `cand` (T, m): of median(cand) / median(base), or, `paired`,
    of the geometric mean of the pair ratios (resampling pairs)."""
    if paired:
        logs = np.log(cand) - np.log(base)
        lo, hi = _interval(logs.shape[0], logs.shape[1], resamples, confidence,
                           lambda rows: _resampled(logs, rows, resamples, rng).mean(axis=2))
        return np.exp(logs.mean(axis=1)), np.exp(lo), np.exp(hi)

    def draws(rows: slice) -> np.ndarray:
        mb = np.median(_resampled(base, rows, resamples, rng), axis=2)
        return np.median(_resampled(cand, rows, resamples, rng), axis=2) / mb

    lo, hi = _interval(base.shape[0], max(base.shape[1], cand.shape[1]), resamples, confidence, draws)
    return np.median(cand, axis=1) / np.median(base, axis=1), lo, hi


def _one(base: Sequence[float], cand: Sequence[float], confidence: float, resamples: int, seed: int | None,
         paired: bool = False) -> tuple[float, float, float]:
    b, c = (np.asarray(x, dtype=float)[None, :] for x in (base, cand))
    ratio, lo, hi = _batch(b, c, confidence, resamples, np.random.default_rng(seed), paired)
    return float(ratio[0]), float(lo[0]), float(hi[0])


def ratio_ci(
    base: Sequence[float], cand: Sequence[float], *, confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0,
) -> tuple[float, float, float]:
    """(ratio of medians cand/base, interval low, interval high). Fixed seed by default, so a
    report rendered twice from the same results file says the same thing."""
    if len(base) < 1 or len(cand) < 1:
        raise ValueError("both sides need at least one value")
    return _one(base, cand, confidence, resamples, seed)


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
        """More passes could still adopt it: the threshold inside the interval, the point estimate a win."""
        return self.decision == "not significant" and self.lo <= 1.0 + self.margin < self.hi and self.ratio > 1.0


def decide(
    base: Sequence[float], cand: Sequence[float], *, margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0,
    paired: bool = False,
) -> Verdict:
    """Adopt `cand` only when the whole bootstrap interval clears `1 + margin`: of the ratio of medians, or,
    `paired` (`base[i]` and `cand[i]` ran back to back), of the geometric mean of the pair ratios. Refuse to
    compare with fewer than `MIN_PASSES` passes on either side (`MIN_PAIRS` pairs)."""
    nb, nc = len(base), len(cand)
    if paired and nb != nc:
        raise ValueError(f"paired passes need as many of each: {nb} and {nc}")
    if min(nb, nc) < (MIN_PAIRS if paired else MIN_PASSES):
        return Verdict("too few passes", nb, nc, margin)
    ratio, lo, hi = _one(base, cand, confidence, resamples, seed, paired)
    return Verdict("adopt" if lo > 1.0 + margin else "not significant", nb, nc, margin, ratio, lo, hi)


def decide_batch(
    base: np.ndarray, cand: np.ndarray, *, margin: float = DEFAULT_MARGIN, confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = 1000, rng: np.random.Generator, paired: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`decide` for the T experiments in the rows of `base` and `cand`, for the simulation: (adopt, open, ratio),
    each (T,); open as `Verdict.open`, paired or not, so the simulation extends exactly what the sweep extends."""
    t = base.shape[0]
    if min(base.shape[1], cand.shape[1]) < (MIN_PAIRS if paired else MIN_PASSES):
        return np.zeros(t, bool), np.zeros(t, bool), np.full(t, np.nan)
    ratio, lo, hi = _batch(base, cand, confidence, resamples, rng, paired)
    threshold = 1.0 + margin
    adopt = lo > threshold
    return adopt, ~adopt & (hi > threshold) & (ratio > 1.0), ratio


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
        return v is None or (v.lo is not None and not v.lo <= 1.0 + v.margin <= v.hi)


def settling(
    baseline: Candidate, candidates: Sequence[Candidate], *, margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0,
    paired: bool = False,
) -> Settling | None:
    """The smallest eligible configuration (the baseline, which wins ties, then those adopted against it) that the
    best does not beat by the decision rule, with that comparison; None when any has fewer than `MIN_PASSES` passes.
    `paired`: pass i of every configuration ran in the same round (an alternated sweep)."""
    everyone = [baseline, *candidates]
    if any(len(c.values) < MIN_PASSES for c in everyone):
        return None
    kw = dict(margin=margin, confidence=confidence, resamples=resamples, seed=seed, paired=paired)
    adopted = [c for c in candidates if decide(baseline.values, c.values, **kw).adopt]
    best = max(everyone, key=lambda c: median(c.values))
    # The best is eligible whenever nothing before it is within noise of it, so this always returns.
    for c in [baseline, *sorted(adopted, key=lambda c: c.order)]:
        if c is best:
            return Settling(c, best, None)
        if not (v := decide(c.values, best.values, **kw)).adopt:
            return Settling(c, best, v)
    raise AssertionError("unreachable")


def neighbour_correlation(labels: Sequence[str], values: Sequence[float]) -> float | None:
    """Lag-1 autocorrelation of log throughput, runs in time order, each configuration's own mean removed: the
    drift shared by neighbouring runs. None with fewer than 4 runs or no spread."""
    if len(labels) != len(values) or len(values) < 4:
        return None
    labels, logs = np.asarray(labels), np.log(np.asarray(values, dtype=float))
    resid = logs.copy()
    for label in set(labels):
        resid[labels == label] -= logs[labels == label].mean()
    var = float(np.mean(resid * resid))
    if var == 0.0:
        return None
    return float(np.mean(resid[1:] * resid[:-1]) / var)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0-100): a value that was measured, never an interpolation; NaN of no values."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = max(0, min(len(v) - 1, math.ceil(q / 100 * len(v)) - 1))
    return v[k]


def cluster_ratio_ci(
    base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], statistic: Callable[[Sequence[float]], float],
    *, confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES, seed: int | None = 0,
) -> tuple[float, float, float]:
    """(statistic(cand) / statistic(base), low, high) over pooled values, the bootstrap resampling whole clusters
    (one session's turns share its load and cache, so resampling values alone would claim too much certainty).
    Empty clusters are dropped; each side needs one value."""
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
