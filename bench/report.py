"""From a results file to words and a figure, in pure functions returning lines. A verdict that does not clear the rule
reads "not significant: keep the default" before any ratio, and one with fewer than `MIN_PASSES` passes gets none.
"""

from __future__ import annotations

import json
import re
import math
from collections.abc import Sequence
from pathlib import Path

from mtpstack.bench.stats import (DEFAULT_CONFIDENCE, DEFAULT_MARGIN, MIN_PASSES, SPREAD_WARN, Candidate, Settling,
                                  Summary, Verdict, decide, settling, summarize)
from mtpstack.errors import UserError

SCHEMA = "mtpstack-bench/1"
#: The metric decisions are made on: output tokens over the whole request, prefill included,
#: so a drafter's own prefill cost counts against it.
PRIMARY_METRIC = "e2e_tps"


class ResultsError(UserError):
    """A results file that cannot be read or compared."""


def load_results(path: str | Path) -> dict:
    """Read a results file written by `mtpstack bench sweep`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"no such results file: `{path}`", "pass the `results.json` a sweep wrote to its `--out` directory") from None
    except (OSError, ValueError) as e:
        raise ResultsError(f"cannot read results file `{path}`: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsError(f"not a bench results file (schema `{SCHEMA}`): `{path}`")
    return data


#: How a workload measured at width w > 1 is keyed in results (`code @ width 2`); width 1 keeps the bare name.
WIDTH_KEY = " @ width "


def workload_key(workload: str, width: int) -> str:
    return workload if width == 1 else f"{workload}{WIDTH_KEY}{width}"


def alternated(results: dict) -> bool:
    """The passes are paired: one process alternated the configurations."""
    return results.get("settings", {}).get("design") == "alternated"


def widths_of(results: dict) -> list[int]:
    return list(results.get("settings", {}).get("widths") or [1])


def workload_names(results: dict) -> list[str]:
    return list(results.get("settings", {}).get("workloads", []))


def workloads_of(results: dict) -> list[str]:
    """Every measured workload key: each workload at each width (`bench sweep --widths`)."""
    return [workload_key(w, width) for width in widths_of(results) for w in workload_names(results)]


def measured(results: dict) -> list[dict]:
    """Configurations that were measured (not aborted), in sweep order."""
    return [c for c in results.get("configurations", []) if c.get("status") == "measured"]


def _passes(config: dict, workload: str) -> list[dict]:
    return config.get("workloads", {}).get(workload, {}).get("passes", [])


def values(config: dict, workload: str, metric: str = PRIMARY_METRIC) -> list[float]:
    return [float(p[metric]) for p in _passes(config, workload) if p.get(metric) is not None]


def acceptance(config: dict, workload: str) -> float | None:
    """Accepted over drafted tokens across all measured passes; None without a drafter."""
    drafted = sum(p.get("drafted") or 0 for p in _passes(config, workload))
    accepted = sum(p.get("accepted") or 0 for p in _passes(config, workload))
    return accepted / drafted if drafted else None


def baseline_of(results: dict) -> dict | None:
    label = results.get("baseline")
    return next((c for c in measured(results) if c["label"] == label), None)


def _margin(results: dict, margin: float | None) -> float:
    """`margin`, else the one the sweep used."""
    return results.get("settings", {}).get("margin", DEFAULT_MARGIN) if margin is None else margin


def candidate(config: dict, workload: str) -> Candidate:
    """A configuration's passes of `workload`, as the depth recommendation weighs them."""
    return Candidate(config["label"], config.get("depth"), tuple(values(config, workload)))


def _settled(results: dict, base: dict, workload: str, margin: float | None) -> Settling | None:
    """The recommendation for `workload` with the comparison it rests on (`stats.settling`), the sweep's rule."""
    others = [candidate(c, workload) for c in measured(results) if c is not base]
    return settling(candidate(base, workload), others, margin=_margin(results, margin), paired=alternated(results))


def _num(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{min(digits, 4)}f}"


def format_summary(s: Summary, unit: str) -> str:
    """hyperfine/pyperf style: `22.1 ± 1.3 tok/s (min 17.4 … max 27.3, n 10)`."""
    return f"{_num(s.median)} ± {_num(s.mad)} {unit} (min {_num(s.min)} … max {_num(s.max)}, n {s.n})"


def spread_warning(workload: str, summaries: Sequence[tuple[str, Summary]]) -> str | None:
    """One warning per workload, with its remedy, naming each configuration whose MAD is a large share of its median."""
    noisy = [(label, s) for label, s in summaries if s.n >= 2 and s.rel_mad > SPREAD_WARN]
    if not noisy:
        return None
    which = ", ".join(f"{label} (MAD {s.rel_mad:.0%}, min … max {s.rel_range:.0%} wide)" for label, s in noisy)
    return (f"warning: {workload}: the spread is large for {which}; differences under that size cannot be told apart"
            " from noise\n\nhint: rerun with more `--repeats` on a quieter machine (close other programs, keep it on"
            " mains power)")


def format_verdict(label: str, baseline: str, v: Verdict, confidence: float = DEFAULT_CONFIDENCE, *, paired: bool = False) -> str:
    """One line per comparison: the decision first, a ratio (`paired`: of pair ratios) only when there is one."""
    if v.decision == "too few passes":
        return (f"{label} vs {baseline}: too few passes to compare (n {v.n_cand} against {v.n_base}, at least"
                f" {MIN_PASSES} per side); no ratio is printed\n\nhint: rerun with `--repeats {MIN_PASSES}` or more")
    ci = f"{confidence:.0%} CI {v.lo:.3f}-{v.hi:.3f}"
    if v.adopt:
        return f"{label} vs {baseline}: adopt: {v.ratio:.3f}x ({ci}, clears {1 + v.margin:.2f})"
    slower = " (slower)" if v.hi is not None and v.hi < 1.0 else ""
    what = "geometric mean of pair ratios" if paired else "ratio"
    return f"{label} vs {baseline}: not significant: keep the default{slower}; {what} {v.ratio:.3f} ({ci}, needs all of it above {1 + v.margin:.2f})"


def noise_note(summaries: Sequence[Summary], *, effect: float = 0.15, margin: float = DEFAULT_MARGIN,
               paired: bool = False) -> str | None:
    """How many unpaired passes the configurations' measured spreads call for (by the normal approximation)."""
    from mtpstack.bench.simulate import repeats_for_power

    usable = [s for s in summaries if s.n >= MIN_PASSES and s.median > 0]
    if not usable or effect <= margin:
        return None
    cvs = sorted(max(1.4826 * s.rel_mad, 1e-4) for s in usable)  # MAD -> sigma, relative
    need = [repeats_for_power(cv=cv, effect=effect, margin=margin) for cv in (cvs[0], cvs[-1])]
    cv_text = f"{cvs[0]:.1%}" if cvs[0] == cvs[-1] else f"{cvs[0]:.1%}-{cvs[-1]:.1%}"
    need_text = str(need[0]) if need[0] == need[1] else f"{need[0]}-{need[1]}"
    tail = " if unpaired; these passes are paired and need fewer (see `mtpstack bench simulate --design paired`)"
    return (f"measured spread: CV about {cv_text} across configurations; detecting a {effect:.0%} win at that spread"
            f" needs about {need_text} passes per side" + (tail if paired else ""))


def workload_table(results: dict, workload: str) -> list[str]:
    lines = [
        "| configuration | drafter | pid | n | end-to-end tok/s (median ± MAD) | min … max | decode tok/s | TTFT s | acceptance | ms per target step |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in measured(results):
        e2e = values(c, workload, "e2e_tps")
        if not e2e:
            continue
        s = summarize(e2e)
        rate = acceptance(c, workload)
        decode, ttft, step = (_num(summarize(v).median) if (v := values(c, workload, m)) else "-"
                              for m in ("decode_tps", "ttft_s", "step_ms"))
        lines.append(
            f"| {c['label']} | {c.get('drafter_kind') or '-'} | {c.get('process', {}).get('pid', '-')} | {s.n} |"
            f" {_num(s.median)} ± {_num(s.mad)} | {_num(s.min)} … {_num(s.max)} | {decode} | {ttft} |"
            f" {'-' if rate is None else f'{rate:.1%}'} | {step} |"
        )
    return lines


def verdicts(results: dict, workload: str, margin: float | None = None) -> list[tuple[dict, Verdict]]:
    base = baseline_of(results)
    if base is None:
        return []
    kw = dict(margin=_margin(results, margin), paired=alternated(results))
    return [(c, decide(values(base, workload), values(c, workload), **kw)) for c in measured(results) if c is not base]


def recommendation_line(results: dict, workload: str, margin: float | None = None) -> str:
    base = baseline_of(results)
    if base is None:
        return f"{workload}: no recommendation: the baseline was not measured"
    settled = _settled(results, base, workload, margin)
    if settled is None:
        return f"{workload}: no recommendation: a configuration has fewer than {MIN_PASSES} passes"
    rec = settled.recommended
    if rec.label == base["label"]:
        line = f"{workload}: not significant: keep the default (`{base['label']}`)"
    else:
        line = f"{workload}: use `{rec.label}` (the smallest depth within noise of the best)"
    v = settled.verdict
    if not settled.decided and v is not None:
        line += (f"; it rests on an undecided comparison: `{settled.best.label}` / `{rec.label}` {v.ratio:.3f}"
                 f" [{v.lo:.3f}, {v.hi:.3f}] straddles {1 + _margin(results, margin):.2f} ({v.n_cand} and {v.n_base}"
                 " passes)")
    return line


def emit_config(results: dict, margin: float | None = None) -> list[str]:
    """The depth map the sweep recommends, as a YAML and a Nix fragment to review; a workload with no recommendation,
    or recommending no drafter (a map cannot say it), keeps the configured `default` and is named in a comment."""
    profile = results.get("meta", {}).get("profile") or {}
    configured = (profile.get("drafter") or {}).get("depth")
    if isinstance(configured, dict):
        configured = configured.get("default")
    if configured is None:
        return ["error: the results name no configured drafter depth to use as `default`"]
    notes: list[str] = []
    depths: dict[str, int | str] = {}
    width = profile.get("maxNumSeqs")
    at = width if width in widths_of(results) else 1
    base = baseline_of(results)
    for workload in workload_names(results) if at in widths_of(results) else []:
        settled = None if base is None else _settled(results, base, workload_key(workload, at), margin)
        if settled is None:
            notes.append(f"{workload}: no recommendation; it keeps `default`")
        elif settled.recommended.depth is None:
            notes.append(f"{workload}: the recommendation is no drafter, which a depth map cannot say; it keeps `default`")
        else:
            depths[workload] = settled.recommended.depth
    depths["default"] = configured
    worker = results.get("meta", {}).get("worker", "WORKER")
    lines = [f"# recommended by `mtpstack bench sweep`, measured at width {at} ({at} concurrent client(s))"]
    if width not in (None, at):
        lines.append(f"# warning: worker `{worker}` serves at width {width}; these depths were not measured there")
    lines += [f"# {n}" for n in notes]
    lines += ["", "# YAML", "workers:", f"  {worker}:", "    drafter:", "      depth:"]
    lines += [f"        {k}: {v}" for k, v in depths.items()]
    nix = "; ".join(f"{k} = {json.dumps(v)}" for k, v in sorted(depths.items()))
    name = worker if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_'-]*", worker) else json.dumps(worker)
    lines += ["", "# Nix", f"services.mtpstack.workers.{name}.drafter.depth = {{ {nix}; }};"]
    return lines


def render_report(results: dict, *, margin: float | None = None) -> list[str]:
    """report.md as lines."""
    meta = results.get("meta", {})
    settings = results.get("settings", {})
    margin, paired = _margin(results, margin), alternated(results)
    start, end = meta.get("load_average_start"), meta.get("load_average_end")
    load = f"{start[0]:.2f} at the start" + (f", {end[0]:.2f} at the end" if end else "") if start else "?"
    lines = [f"# Bench: worker `{meta.get('worker', '?')}`", ""]
    facts = {
        "config": f"`{meta.get('config_file', '?')}`",
        "host": f"{meta.get('host', '?')} ({meta.get('cpus', '?')} CPUs, load average {load})",
        "device": f"{meta.get('device', '?')} (BLAS: {meta.get('blas', '?')})",
        "versions": ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items()) or "?",
        "git revision": meta.get("git_revision") or "?",
        "when": meta.get("started") or "?",
        "method": f"{settings.get('warmup', 1)} warm-up pass discarded, then {settings.get('repeats', '?')} measured"
                  f" passes per workload (up to {settings.get('max_repeats', '?')} while a verdict is open), greedy,"
                  f" max_tokens {settings.get('max_tokens', '?')}, "
                  + ("one request at a time" if widths_of(results) == [1] else
                     f"at widths {', '.join(map(str, widths_of(results)))} (that many concurrent clients; tok/s"
                     " aggregate beyond 1, output compared at width 1 only)")
                  + (", every configuration in one worker (its depth carried per request by `num_draft_tokens`), a"
                     " pass is one round of all configurations in rotating order, paired" if paired
                     else ", a fresh worker per configuration"),
        "design": settings.get("design", "fresh")
                  + (f" ({settings['design_reason']})" if settings.get("design_reason") else ""),
        "decision": "adopt only when the whole 95% bootstrap interval of the "
                    + ("geometric mean of the paired ratios" if paired else "ratio of medians")
                    + f" ({PRIMARY_METRIC}) clears {1 + margin:.2f}",
        "baseline": f"`{results.get('baseline', '?')}`",
    }
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    if "reference" in str(meta.get("blas", "")):
        lines += ["", "warning: the workers ran mlx on its bundled reference BLAS, many times slower than OpenBLAS;"
                  " these figures say little about a configured machine",
                  "", "hint: install Debian's OpenBLAS (`apt-get install libopenblas0-pthread`); the launcher preloads it"]
    if meta.get("stopped"):
        lines += ["", f"error: the sweep stopped early: {meta['stopped']}"]
    for c in [c for c in results.get("configurations", []) if c.get("status") != "measured"]:
        lines += ["", f"error: configuration `{c['label']}` was not measured: {c.get('error', 'unknown reason')}"]
    for workload in workloads_of(results):
        summaries = [(c["label"], summarize(values(c, workload))) for c in measured(results) if values(c, workload)]
        notes = [spread_warning(workload, summaries),
                 noise_note([s for _, s in summaries], margin=margin, paired=paired),
                 *(format_verdict(c["label"], results.get("baseline", "baseline"), v, paired=paired)
                   for c, v in verdicts(results, workload, margin)),
                 "recommendation: " + recommendation_line(results, workload, margin)]
        lines += ["", f"## {workload}", "", *workload_table(results, workload), ""]
        for note in filter(None, notes):
            lines += [note, ""]
        lines.pop()
    if mismatch := output_mismatches(results):
        lines += ["", *mismatch]
    return lines


def output_mismatches(results: dict) -> list[str]:
    """Where greedy text differed with and without a drafter: one warning per workload and configuration."""
    out = []
    # At width 2-4 the batch's makeup changes float results, so text is compared at width 1 only.
    for workload in workload_names(results) if 1 in widths_of(results) else []:
        first: dict[str, tuple[str, str]] = {}  # prompt id -> (output digest, configuration)
        for c in measured(results):
            wl = c.get("workloads", {}).get(workload, {})
            for r in (r for p in [wl.get("warmup") or {}, *wl.get("passes", [])] for r in p.get("requests", [])):
                key, digest = r.get("prompt_id"), r.get("output_sha256")
                if key is None or digest is None:
                    continue
                seen = first.setdefault(key, (digest, c["label"]))
                if seen[0] != digest:
                    out.append(f"warning: {workload}: prompt `{key}` gave different greedy output under `{c['label']}`"
                               f" than under `{seen[1]}`; speculative decoding should not change greedy text")
                    break
    return out


def compare_lines(a: dict, b: dict, *, a_name: str = "A", b_name: str = "B", margin: float = DEFAULT_MARGIN) -> list[str]:
    """`bench compare`: each configuration of B against A's of the same label (or the only one), by the sweep's rule."""
    ca, cb = measured(a), measured(b)
    pairs: list[tuple[dict, dict]] = [(x, y) for x in ca for y in cb if x["label"] == y["label"]]
    if not pairs and len(ca) == 1 and len(cb) == 1:
        pairs = [(ca[0], cb[0])]
    lines = []
    ma, mb = a.get("meta", {}), b.get("meta", {})
    for key in ("host", "device", "blas", "git_revision", "versions"):
        if ma.get(key) != mb.get(key):
            differ = "differ" if key == "versions" else "differs"
            lines.append(f"note: {key} {differ}: {ma.get(key)} ({a_name}) vs {mb.get(key)} ({b_name})")
    if not pairs:
        lines.append(f"error: no configuration to compare: {a_name} has {', '.join(c['label'] for c in ca) or 'none'},"
                     f" {b_name} has {', '.join(c['label'] for c in cb) or 'none'}")
        return lines
    workloads = [w for w in workloads_of(a) if w in workloads_of(b)]
    for x, y in pairs:
        hx, hy = _target_hash(x), _target_hash(y)
        if hx and hy and hx != hy:
            lines.append(f"note: `{x['label']}`: the target weights differ ({hx[:12]} vs {hy[:12]})")
        for w in workloads:
            vx, vy = values(x, w), values(y, w)
            if not vx or not vy:
                continue
            lines.append(f"{w}, {x['label']}: {a_name} {format_summary(summarize(vx), 'tok/s')}")
            lines.append(f"{w}, {y['label']}: {b_name} {format_summary(summarize(vy), 'tok/s')}")
            label = f"{w}: {b_name} `{y['label']}`"
            lines.append(format_verdict(label, f"{a_name} `{x['label']}`", decide(vx, vy, margin=margin)))
    return lines


def _target_hash(config: dict) -> str | None:
    ident = (config.get("proof") or {}).get("identity") or {}
    return ((ident.get("target") or {}).get("sha256")) or None


def plot_points(results: dict, workload: str) -> list[tuple[int, str, Summary]]:
    """(x, tick label, summary) per configuration: no drafter at 0, `auto` one past the deepest fixed depth."""
    found = [(c.get("depth"), v) for c in measured(results) if (v := values(c, workload))]
    past = 1 + max((d for d, _ in found if isinstance(d, int)), default=0)
    out = [(0 if d is None else d if isinstance(d, int) else past, "none" if d is None else str(d), summarize(v))
           for d, v in found]
    return sorted(out, key=lambda p: p[0])


def plot_sweep(results: dict, path: str | Path) -> Path:
    """sweep.png: end-to-end tok/s by draft depth, medians with MAD (thick) and min … max (thin) bars."""
    names = workload_names(results) or ["?"]
    widths = widths_of(results)
    # One row of panels per width (aggregate tok/s of w concurrent clients), one column per workload.
    fig, axes = figure(len(widths), len(names), figsize=(5.0 * len(names), 4.0 * len(widths)), sharey="row", squeeze=False)
    base = baseline_of(results)
    cells = [(axes[i][j], workload_key(w, width)) for i, width in enumerate(widths) for j, w in enumerate(names)]
    for ax, workload in cells:
        points = plot_points(results, workload)
        if points:
            xs, ticks, spreads = zip(*points)
            med = [s.median for s in spreads]
            ax.errorbar(xs, med, yerr=[[s.median - s.min for s in spreads], [s.max - s.median for s in spreads]],
                        fmt="none", ecolor="0.6", elinewidth=1, capsize=4, label="min … max")
            ax.errorbar(xs, med, yerr=[s.mad for s in spreads], fmt="o-", color="C0", elinewidth=3, capsize=0,
                        label="median ± MAD")
            ax.set_xticks(xs, ticks)
            if base is not None and values(base, workload):
                ax.axhline(summarize(values(base, workload)).median, color="C3", ls="--", lw=1, label=f"baseline ({base['label']})")
        ax.set_title(workload)
        ax.set_xlabel("draft depth")
        ax.grid(alpha=0.3)
    for i, width in enumerate(widths):
        axes[i][0].set_ylabel("end-to-end tok/s" + (f", width {width}" if len(widths) > 1 else ""))
    axes[0][-1].legend(loc="best", fontsize="small")
    fig.suptitle(f"worker `{results.get('meta', {}).get('worker', '?')}`: end-to-end tok/s by draft depth")
    return save_figure(fig, path)


def figure(*args, **kwargs):
    """`plt.subplots(*args, **kwargs)` drawn off-screen (Agg): how every bench figure starts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write at 110 dpi and close: how every bench figure ends."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)

