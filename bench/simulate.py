"""Decision quality, shown: how often the sweep's rule (`mtpstack.bench.stats.decide_batch`) is fooled, on
synthetic lognormal runs with a known truth, beside a naive ratio of medians. The default CV, 0.14, puts the
middle 90% of single runs at 17.5-27.7 tok/s around 22: the spread measured on one machine serving
byte-identical output (17.4-27.3).
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
#: Fewer resamples than a real decision: the interval's ends get a little noisier, the
#: rates do not move, and the whole table takes seconds instead of a minute.
DEFAULT_RESAMPLES = 500
SIMULATED_REPEATS = (1, 3, 5, 10, 20, 30, 40, 60)
#: The highest false-adopt rate the rule may show at any n.
FALSE_ADOPT_LIMIT = 0.05
#: Detection rate the "repeats needed" line aims for.
TARGET_POWER = 0.80
#: Drift correlation between neighbouring runs assumed by the paired simulation.
DEFAULT_RHO = 0.5
PAIRED_REPEATS = (3, 5, 10, 15, 20, 25, 30)


def lognormal_sigma(cv: float) -> float:
    """The log-space sigma of a lognormal with coefficient of variation `cv`."""
    return math.sqrt(math.log1p(cv * cv))


def draw(rng: np.random.Generator, shape: tuple[int, ...], *, cv: float, median: float = DEFAULT_MEDIAN) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, lognormal_sigma(cv), size=shape))


@dataclass(frozen=True)
class Setup:
    """What every simulated experiment assumes: the runs' spread, the true win, the rule's margin,
    how many experiments per cell and how many bootstrap resamples each decision draws."""

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
    """The highest false-adopt rate of the rule in `rows`; None where it refused every time."""
    return max((x for r in rows for x in r.false_adopts if x is not None), default=None)


def exit_status(rows: Sequence[Row | PairedRow]) -> int:
    """`mtpstack bench simulate`'s: 1 when the rule's false-adopt rate is above the limit at any n."""
    return 0 if (worst_false_adopt(rows) or 0.0) <= FALSE_ADOPT_LIMIT else 1


def _adopt_rate(n: int, effect: float, setup: Setup, rng: np.random.Generator,
                on_step: Callable[[], None] | None) -> tuple[float | None, float]:
    """The rule's adopt rate (None: it refuses) and the naive one, at n passes per side and a true `effect`."""
    base = draw(rng, (setup.trials, n), cv=setup.cv)
    cand = draw(rng, (setup.trials, n), cv=setup.cv) * (1.0 + effect)
    naive = float(np.mean(np.median(cand, axis=1) / np.median(base, axis=1) > 1.0 + setup.margin))
    rule = None
    if n >= MIN_PASSES:
        rule = float(decide_batch(base, cand, margin=setup.margin, resamples=setup.resamples, rng=rng)[0].mean())
    if on_step:
        on_step()
    return rule, naive


def simulate(
    repeats: Sequence[int] = SIMULATED_REPEATS, setup: Setup = Setup(), *, seed: int = 0,
    on_step: Callable[[], None] | None = None,
) -> list[Row]:
    """One row per number of passes per side; each rate from `setup.trials` independent experiments."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in repeats:
        (rule_null, naive_null), (rule_win, naive_win) = (_adopt_rate(n, effect, setup, rng, on_step)
                                                          for effect in (0.0, setup.effect))
        rows.append(Row(n, rule_null, rule_win, naive_null, naive_win))
    return rows


def _sequential(base: np.ndarray, cand: np.ndarray, start: int, cap: int, setup: Setup, rng: np.random.Generator, *,
                paired: bool) -> tuple[np.ndarray, np.ndarray]:
    """The sweep's procedure on each row: `start` passes, then one more at a time while the verdict is open,
    up to `cap` (paired: a pass is a pair; else only the candidate's passes grow, `base` is all its own).
    Looking again after every pass gives the rule more chances to be fooled; this measures how many.
    Returns the passes at which each row was adopted (inf: never) and at which it stopped."""
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
    for true_effect in (0.0, setup.effect):
        base = draw(rng, (setup.trials, n), cv=setup.cv)
        cand = draw(rng, (setup.trials, cap), cv=setup.cv) * (1.0 + true_effect)
        adopted_at, stopped_at = _sequential(base, cand, n, cap, setup, rng, paired=False)
        rates.append((float(np.mean(adopted_at < np.inf)), float(stopped_at.mean())))
    (null_rate, null_passes), (win_rate, win_passes) = rates
    return AdaptiveRow(n, cap, null_rate, win_rate, null_passes, win_passes)


def repeats_needed(rows: Sequence[Row], power: float = TARGET_POWER) -> int | None:
    """The smallest simulated n at which the rule detects the win at least `power` of the time."""
    return next((r.n for r in rows if r.rule_detect is not None and r.rule_detect >= power), None)


def repeats_for_power(
    *, cv: float = DEFAULT_CV, effect: float = DEFAULT_EFFECT, margin: float = DEFAULT_MARGIN,
    power: float = TARGET_POWER, confidence: float = 0.95,
) -> int:
    """Normal-approximation estimate of the passes per side the rule needs for `power`
    (the median's standard error is about 1.2533 sigma / sqrt(n)). A guide; the table is the measurement."""
    if effect <= margin:
        raise ValueError(f"a win of {effect:.0%} can never clear a margin of {margin:.0%}")
    z = {0.90: 1.645, 0.95: 1.96, 0.99: 2.576}.get(confidence, 1.96)
    z_power = {0.5: 0.0, 0.8: 0.8416, 0.9: 1.2816, 0.95: 1.645}.get(power, 0.8416)
    gap = math.log1p(effect) - math.log1p(margin)
    # SE of the log ratio of medians = 1.2533 * sigma * sqrt(2 / n)
    n = 2.0 * (1.2533 * lognormal_sigma(cv) * (z + z_power) / gap) ** 2
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


def format_table(rows: Sequence[Row], *, effect: float = DEFAULT_EFFECT, margin: float = DEFAULT_MARGIN) -> list[str]:
    """A Markdown table: one line per n. Pure, for tests and docs."""
    win = f"{effect:.0%}"
    return [
        f"| passes per side | rule: false adopt | rule: detects a {win} win | naive: false adopt | naive: detects a {win} win |",
        "| ---: | ---: | ---: | ---: | ---: |",
        *(f"| {r.n} | {_pct(r.rule_false_adopt)} | {_pct(r.rule_detect)} | {_pct(r.naive_false_adopt)} |"
          f" {_pct(r.naive_detect)} |" for r in rows),
    ]


def format_report(
    rows: Sequence[Row], *, cv: float, effect: float, margin: float, trials: int, seed: int,
    adaptive: AdaptiveRow | None = None, power: float = TARGET_POWER,
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
        *format_table(rows, effect=effect, margin=margin),
        "",
        *_worst_line(rows, " of the rule"),
    ]
    if rows:
        needed = repeats_needed(rows, power)
        found = needed if needed is not None else f"more than {max(r.n for r in rows)}"
        lines.append(f"passes per side for {power:.0%} detection of a {effect:.0%} win: {found} (measured)")
    lines.append(f"normal-approximation estimate: {repeats_for_power(cv=cv, effect=effect, margin=margin, power=power)}")
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


# -- paired passes with drift ------------------------------------------------------------


def drifting_runs(rng: np.random.Generator, trials: int, runs: int, *, cv: float, rho: float) -> np.ndarray:
    """(trials, runs) lognormal throughputs in time order whose log noise is AR(1): neighbouring runs
    correlate by `rho`, every run keeps the CV `cv`."""
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
    """(base, cand), each (trials, pairs): pair i runs AB when i is even, BA when odd. `process_cv`:
    the spread between worker processes, drawn once per configuration when both stay `resident`,
    else once per run (a fresh process per pass)."""
    series = drifting_runs(rng, trials, 2 * pairs, cv=cv, rho=rho)
    first, second = series[:, 0::2], series[:, 1::2]
    ab = (np.arange(pairs) % 2 == 0)[None, :]
    base = np.where(ab, first, second)
    cand = np.where(ab, second, first) * (1.0 + effect)
    if process_cv > 0:
        ps = lognormal_sigma(process_cv)
        shape = (trials, 1) if resident else (trials, pairs)
        base = base * np.exp(rng.normal(0.0, ps, shape))
        cand = cand * np.exp(rng.normal(0.0, ps, shape))
    return base, cand


def simulate_paired(
    repeats: Sequence[int] = PAIRED_REPEATS, setup: Setup = Setup(), *, start: int = 10, cap: int = 30,
    rho: float = DEFAULT_RHO, process_cv: float = 0.0, resident: bool = False, seed: int = 0,
) -> list[PairedRow]:
    """False adopts (true ratio 1.0) and power (true win `setup.effect`) of the paired rule, per number
    of pairs: with exactly n pairs, and for the sequential procedure (`start` pairs, then one more pair
    at a time while the interval straddles `1 + margin`, up to `cap`) as the share adopted by n."""
    rng = np.random.default_rng(seed)
    ns = sorted(set(repeats))
    fixed: dict[tuple[int, float], float | None] = {}
    sequential: dict[tuple[int, float], float | None] = {}
    for true in (0.0, setup.effect):
        base, cand = paired_runs(rng, setup.trials, max([cap, *ns]), true, cv=setup.cv, rho=rho, process_cv=process_cv,
                                 resident=resident)
        for n in ns:
            fixed[n, true] = None
            if n >= MIN_PAIRS:
                adopt, _, _ = decide_batch(base[:, :n], cand[:, :n], paired=True, margin=setup.margin,
                                           resamples=setup.resamples, rng=rng)
                fixed[n, true] = float(adopt.mean())
        adopted_at, _ = _sequential(base, cand, start, cap, setup, rng, paired=True)
        for n in ns:
            sequential[n, true] = float(np.mean(adopted_at <= n)) if start <= n <= cap else None
    return [PairedRow(n, fixed[n, 0.0], fixed[n, setup.effect], sequential[n, 0.0], sequential[n, setup.effect])
            for n in ns]


def paired_json(rows: Sequence[PairedRow], **settings) -> dict:
    """`mtpstack bench simulate --design paired --format json`: per number of passes, `false_adopt` and `power`."""
    return {"design": "paired", "settings": settings,
            "passes": [{"n": r.n, "false_adopt": r.false_adopt, "power": r.power,
                        "sequential": {"false_adopt": r.seq_false_adopt, "power": r.seq_power}} for r in rows]}


def format_paired_report(
    rows: Sequence[PairedRow], *, cv: float, rho: float, measured_rho: float | None, effect: float, margin: float,
    start: int, cap: int, process_cv: float, resident: bool, trials: int, seed: int, power: float = TARGET_POWER,
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
        f"sequential: {start} pairs, then one more while the interval straddles {1 + margin:.2f}, up to {cap}",
        f"{trials} simulated experiments per cell, seed {seed}",
        "",
        f"| passes (pairs) | fixed n: false adopt | fixed n: detects a {effect:.0%} win | sequential: false adopt by n | sequential: detects by n |",
        "| ---: | ---: | ---: | ---: | ---: |",
        *(f"| {r.n} | {_pct(r.false_adopt)} | {_pct(r.power)} | {_pct(r.seq_false_adopt, '-')} |"
          f" {_pct(r.seq_power, '-')} |" for r in rows),
        "",
        *_worst_line(rows, "", always=True),
    ]
    at_cap = next((r.seq_power for r in rows if r.n == cap), None)
    if at_cap is not None:
        lines.append(f"power within {cap} passes (sequential): {at_cap:.1%} ({'meets' if at_cap >= power else 'BELOW'} the {power:.0%} goal)")
    return lines
