"""Decision quality, shown: how often the sweep's rule (`stats.decide_batch`) is fooled on synthetic lognormal runs
with a known truth, beside a naive ratio of medians. The default CV, 0.14, puts the middle 90% of single runs at
17.5-27.7 tok/s around 22, the spread measured serving byte-identical output (17.4-27.3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mtpstack.bench.stats import DEFAULT_MARGIN, MIN_PAIRS, MIN_PASSES, decide_batch

DEFAULT_CV = 0.14
DEFAULT_EFFECT = 0.15
DEFAULT_MEDIAN = 22.0
DEFAULT_TRIALS = 1000
#: Fewer resamples than a real decision: the interval's ends a little noisier, the rates unmoved, seconds not a minute.
DEFAULT_RESAMPLES = 500
SIMULATED_REPEATS = (1, 3, 5, 10, 20, 30, 40, 60)
FALSE_ADOPT_LIMIT = 0.05
TARGET_POWER = 0.80
#: Drift correlation between neighbouring runs assumed by the paired simulation.
DEFAULT_RHO = 0.5
PAIRED_REPEATS = (3, 5, 10, 15, 20, 25, 30)


def lognormal_sigma(cv: float) -> float:
    """The log-space sigma of a lognormal with coefficient of variation `cv`."""
    return math.sqrt(math.log1p(cv * cv))


@dataclass(frozen=True)
class Setup:
    """The runs' CV, the true win, the rule's margin, experiments per cell and resamples per decision."""

    cv: float = DEFAULT_CV
    effect: float = DEFAULT_EFFECT
    margin: float = DEFAULT_MARGIN
    trials: int = DEFAULT_TRIALS
    resamples: int = DEFAULT_RESAMPLES


@dataclass(frozen=True)
class Row:
    n: int
    rule_false_adopt: float | None  # None: the rule refuses (n < MIN_PASSES)
    rule_detect: float | None
    naive_false_adopt: float
    naive_detect: float

    @property
    def false_adopts(self) -> tuple[float | None, ...]:
        return (self.rule_false_adopt,)


@dataclass(frozen=True)
class AdaptiveRow:
    n: int
    cap: int
    false_adopt: float
    detect: float
    mean_passes_null: float
    mean_passes_win: float


@dataclass(frozen=True)
class PairedRow:
    n: int  # pairs (passes)
    false_adopt: float | None  # fixed design: exactly n pairs, one look; None below MIN_PAIRS
    power: float | None
    seq_false_adopt: float | None  # sequential: `start` pairs, one more while undecided; adopted by n
    seq_power: float | None

    @property
    def false_adopts(self) -> tuple[float | None, ...]:
        return (self.false_adopt, self.seq_false_adopt)


def worst_false_adopt(rows: Sequence[Row | PairedRow]) -> float | None:
    """None where the rule refused every time."""
    return max((x for r in rows for x in r.false_adopts if x is not None), default=None)


def exit_status(rows: Sequence[Row | PairedRow]) -> int:
    """`mtpstack bench simulate`'s: 1 when the rule's false-adopt rate is above the limit at any n."""
    return 0 if (worst_false_adopt(rows) or 0.0) <= FALSE_ADOPT_LIMIT else 1


def _blocks(rng: np.random.Generator, setup: Setup, n: int, m: int, effect: float) -> tuple[np.ndarray, np.ndarray]:
    """`setup.trials` experiments of n base and m candidate passes, the candidate's true win `effect`."""
    sigma = lognormal_sigma(setup.cv)
    base, cand = (DEFAULT_MEDIAN * np.exp(rng.normal(0.0, sigma, size=(setup.trials, k))) for k in (n, m))
    return base, cand * (1.0 + effect)


def _adopt_rate(base: np.ndarray, cand: np.ndarray, setup: Setup, rng: np.random.Generator, *,
                paired: bool = False) -> float:
    adopt, _, _ = decide_batch(base, cand, paired=paired, margin=setup.margin, resamples=setup.resamples, rng=rng)
    return float(adopt.mean())


def simulate(
    repeats: Sequence[int] = SIMULATED_REPEATS, setup: Setup = Setup(), *, seed: int = 0,
    on_step: Callable[[], None] | None = None,
) -> list[Row]:
    """One row per number of passes per side; each rate from `setup.trials` independent experiments."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in repeats:
        rule, naive = [], []  # at no effect, then at the true win
        for effect in (0.0, setup.effect):
            base, cand = _blocks(rng, setup, n, n, effect)
            naive.append(float(np.mean(np.median(cand, axis=1) / np.median(base, axis=1) > 1.0 + setup.margin)))
            rule.append(_adopt_rate(base, cand, setup, rng) if n >= MIN_PASSES else None)
            if on_step:
                on_step()
        rows.append(Row(n, *rule, *naive))
    return rows


def _sequential(base: np.ndarray, cand: np.ndarray, start: int, cap: int, setup: Setup, rng: np.random.Generator, *,
                paired: bool) -> tuple[np.ndarray, np.ndarray]:
    """The sweep's procedure on each row, `start` passes, then one more while the verdict is open, up to `cap` (paired:
    a pass is a pair; else only the candidate's grow): each look is one more chance to be fooled. Returns the passes
    at which each row was adopted (inf: never) and at which it stopped."""
    adopted_at = np.full(base.shape[0], np.inf)
    stopped_at = np.full(base.shape[0], start)
    live = np.arange(base.shape[0])
    for k in range(start, cap + 1):
        adopt, still_open, _ = decide_batch(base[live, :k] if paired else base[live], cand[live, :k], paired=paired,
                                            margin=setup.margin, resamples=setup.resamples, rng=rng)
        adopted_at[live[adopt]] = k
        stopped_at[live] = k
        live = live[still_open]
        if live.size == 0:
            break
    return adopted_at, stopped_at


def simulate_adaptive(n: int, cap: int, setup: Setup = Setup(), *, seed: int = 0) -> AdaptiveRow:
    """The sweep's full procedure (`_sequential`), n passes per side, up to `cap` candidate passes."""
    rng = np.random.default_rng(seed)
    rates = []
    for effect in (0.0, setup.effect):
        adopted_at, stopped_at = _sequential(*_blocks(rng, setup, n, cap, effect), n, cap, setup, rng, paired=False)
        rates.append((float(np.mean(adopted_at < np.inf)), float(stopped_at.mean())))
    (null_rate, null_passes), (win_rate, win_passes) = rates
    return AdaptiveRow(n, cap, null_rate, win_rate, null_passes, win_passes)


def repeats_needed(rows: Sequence[Row], power: float = TARGET_POWER) -> int | None:
    """The smallest simulated n at which the rule detects the win at least `power` of the time."""
    return next((r.n for r in rows if r.rule_detect is not None and r.rule_detect >= power), None)


def repeats_for_power(*, cv: float = DEFAULT_CV, effect: float = DEFAULT_EFFECT, margin: float = DEFAULT_MARGIN) -> int:
    """Normal-approximation estimate of the passes per side the rule needs for `TARGET_POWER` at 95% confidence (the
    log ratio of medians has a standard error of about 1.2533 sigma sqrt(2 / n)). A guide; the table measures."""
    if effect <= margin:
        raise ValueError(f"a win of {effect:.0%} can never clear a margin of {margin:.0%}")
    gap = math.log1p(effect) - math.log1p(margin)
    n = 2.0 * (1.2533 * lognormal_sigma(cv) * (1.96 + 0.8416) / gap) ** 2  # z of 95% two-sided, of 80% power
    return max(MIN_PASSES, math.ceil(n))


def _pct(x: float | None, none: str = "refuses") -> str:
    return none if x is None else f"{x:.1%}"


def _worst_line(rows: Sequence[Row | PairedRow], what: str, *, always: bool = False) -> list[str]:
    worst = worst_false_adopt(rows)
    if worst is None and not always:
        return []
    worst = worst or 0.0
    verdict = "within" if worst <= FALSE_ADOPT_LIMIT else "ABOVE"
    return [f"worst false-adopt rate{what}: {worst:.1%} ({verdict} the {FALSE_ADOPT_LIMIT:.0%} limit)"]


def _table(head: Sequence[str], cells) -> list[str]:
    """A Markdown table of right-aligned columns."""
    return ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head), *("| " + " | ".join(c) + " |" for c in cells)]


def format_table(rows: Sequence[Row], *, effect: float = DEFAULT_EFFECT) -> list[str]:
    win = f"detects a {effect:.0%} win"
    return _table(["passes per side", "rule: false adopt", f"rule: {win}", "naive: false adopt", f"naive: {win}"],
                  ([str(r.n), *map(_pct, (r.rule_false_adopt, r.rule_detect, r.naive_false_adopt, r.naive_detect))]
                   for r in rows))


def format_report(
    rows: Sequence[Row], *, cv: float, effect: float, margin: float, trials: int, seed: int,
    adaptive: AdaptiveRow | None = None,
) -> list[str]:
    """The full `mtpstack bench simulate` output as lines. Pure."""
    sigma = lognormal_sigma(cv)
    lo, hi = DEFAULT_MEDIAN * math.exp(-1.645 * sigma), DEFAULT_MEDIAN * math.exp(1.645 * sigma)
    lines = [
        f"noise: lognormal, CV {cv:.0%} (90% of single runs at {DEFAULT_MEDIAN:g} tok/s fall in {lo:.1f}-{hi:.1f})",
        f"rule: adopt only when the whole 95% bootstrap interval of the ratio of medians clears {1 + margin:.2f}",
        f"naive: adopt when the ratio of medians alone exceeds {1 + margin:.2f} (n = 1: two runs, divided)",
        f"{trials} simulated experiments per cell, seed {seed}",
        "",
        *format_table(rows, effect=effect),
        "",
        *_worst_line(rows, " of the rule"),
    ]
    if rows:
        needed = repeats_needed(rows)
        found = needed if needed is not None else f"more than {max(r.n for r in rows)}"
        lines.append(f"passes per side for {TARGET_POWER:.0%} detection of a {effect:.0%} win: {found} (measured)")
    lines.append(f"normal-approximation estimate: {repeats_for_power(cv=cv, effect=effect, margin=margin)}")
    if adaptive is not None:
        lines += [
            "",
            f"the sweep's procedure ({adaptive.n} passes, then one more at a time while the verdict is open, up to {adaptive.cap}):",
            f"  false adopt {adaptive.false_adopt:.1%} (mean {adaptive.mean_passes_null:.1f} passes),"
            f" detects a {effect:.0%} win {adaptive.detect:.1%} (mean {adaptive.mean_passes_win:.1f} passes)",
        ]
    return lines


def blocks_json(rows: Sequence[Row], adaptive: AdaptiveRow | None, **settings) -> dict:
    """`mtpstack bench simulate --format json`: per number of passes, `false_adopt` and `power`."""
    return {"design": "blocks", "settings": settings,
            "passes": [{"n": r.n, "false_adopt": r.rule_false_adopt, "power": r.rule_detect} for r in rows],
            "adaptive": None if adaptive is None else {"start": adaptive.n, "cap": adaptive.cap,
                                                       "false_adopt": adaptive.false_adopt, "power": adaptive.detect}}


def drifting_runs(rng: np.random.Generator, trials: int, runs: int, *, cv: float, rho: float) -> np.ndarray:
    """(trials, runs) lognormal throughputs in time order, their log noise AR(1): neighbours correlate by `rho`."""
    z = np.empty((trials, runs))
    z[:, 0] = rng.normal(0.0, 1.0, trials)
    shock = math.sqrt(max(0.0, 1.0 - rho * rho))
    for t in range(1, runs):
        z[:, t] = rho * z[:, t - 1] + shock * rng.normal(0.0, 1.0, trials)
    return DEFAULT_MEDIAN * np.exp(lognormal_sigma(cv) * z)


def paired_runs(
    rng: np.random.Generator, trials: int, pairs: int, effect: float, *, cv: float, rho: float,
    process_cv: float = 0.0, resident: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(base, cand), each (trials, pairs), pair i AB when i is even, BA when odd. `process_cv`: the spread between
    worker processes, drawn once per configuration when both stay `resident`, else once per run."""
    series = drifting_runs(rng, trials, 2 * pairs, cv=cv, rho=rho)
    first, second = series[:, 0::2], series[:, 1::2]
    ab = (np.arange(pairs) % 2 == 0)[None, :]
    base = np.where(ab, first, second)
    cand = np.where(ab, second, first) * (1.0 + effect)
    if process_cv > 0:
        shape = (trials, 1) if resident else (trials, pairs)
        base, cand = (x * np.exp(rng.normal(0.0, lognormal_sigma(process_cv), shape)) for x in (base, cand))
    return base, cand


def simulate_paired(
    repeats: Sequence[int] = PAIRED_REPEATS, setup: Setup = Setup(), *, start: int = 10, cap: int = 30,
    rho: float = DEFAULT_RHO, process_cv: float = 0.0, resident: bool = False, seed: int = 0,
) -> list[PairedRow]:
    """False adopts (true ratio 1.0) and power (true win `setup.effect`) of the paired rule, per number
    of pairs: with exactly n pairs, and for the sequential procedure (`start` pairs, then one more pair
    at a time while the verdict is open, as the sweep's, up to `cap`) as the share adopted by n."""
    rng = np.random.default_rng(seed)
    ns = sorted(set(repeats))
    fixed, sequential = [], []  # per n, at no effect and then at the true win
    for effect in (0.0, setup.effect):
        base, cand = paired_runs(rng, setup.trials, max([cap, *ns]), effect, cv=setup.cv, rho=rho,
                                 process_cv=process_cv, resident=resident)
        fixed.append([_adopt_rate(base[:, :n], cand[:, :n], setup, rng, paired=True) if n >= MIN_PAIRS else None
                      for n in ns])
        adopted_at, _ = _sequential(base, cand, start, cap, setup, rng, paired=True)
        sequential.append([float(np.mean(adopted_at <= n)) if start <= n <= cap else None for n in ns])
    return [PairedRow(*row) for row in zip(ns, *fixed, *sequential)]


def paired_json(rows: Sequence[PairedRow], **settings) -> dict:
    """`mtpstack bench simulate --design paired --format json`: per number of passes, `false_adopt` and `power`."""
    return {"design": "paired", "settings": settings,
            "passes": [{"n": r.n, "false_adopt": r.false_adopt, "power": r.power,
                        "sequential": {"false_adopt": r.seq_false_adopt, "power": r.seq_power}} for r in rows]}


def format_paired_report(
    rows: Sequence[PairedRow], *, cv: float, rho: float, measured_rho: float | None, effect: float, margin: float,
    start: int, cap: int, process_cv: float, resident: bool, trials: int, seed: int,
) -> list[str]:
    """The paired design's report as lines. Pure."""
    measured = "not measured (pass `--rho-from RUNS.json`)" if measured_rho is None else f"{measured_rho:.2f}"
    lines = [
        f"noise: lognormal, CV {cv:.0%}; drift: AR(1), correlation between neighbouring runs rho {rho:.2f}"
        f" (measured on this machine: {measured})",
        f"processes: {'two resident (one per configuration)' if resident else 'a fresh one per run'},"
        f" spread between processes CV {process_cv:.0%}",
        "design: a pass is one pair (AB, then BA); rule: the whole 95% bootstrap interval of the geometric mean"
        f" of the pair ratios clears {1 + margin:.2f}",
        f"sequential: {start} pairs, then one more while open (the interval straddles {1 + margin:.2f}, the estimate a win),"
        f" up to {cap}",
        f"{trials} simulated experiments per cell, seed {seed}",
        "",
        *_table(["passes (pairs)", "fixed n: false adopt", f"fixed n: detects a {effect:.0%} win",
                 "sequential: false adopt by n", "sequential: detects by n"],
                ([str(r.n), _pct(r.false_adopt), _pct(r.power), _pct(r.seq_false_adopt, "-"), _pct(r.seq_power, "-")]
                 for r in rows)),
        "",
        *_worst_line(rows, "", always=True),
    ]
    at_cap = next((r.seq_power for r in rows if r.n == cap), None)
    if at_cap is not None:
        lines.append(f"power within {cap} passes (sequential): {at_cap:.1%}"
                     f" ({'meets' if at_cap >= TARGET_POWER else 'BELOW'} the {TARGET_POWER:.0%} goal)")
    return lines
