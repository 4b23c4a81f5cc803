"""`mtpstack bench sweep|report|compare|simulate`: `sweep` writes raw passes to `results.json` (and renders from it),
`report` and `compare` only read result files. Data goes to stdout, progress and errors to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mtpstack.bench.stats import DEFAULT_MARGIN, DEFAULT_MAX_REPEATS, DEFAULT_REPEATS
from mtpstack.errors import print_error


def register(subparsers: argparse._SubParsersAction) -> None:
    from mtpstack.bench import simulate as sim
    from mtpstack.bench import sweep as sw

    bench = subparsers.add_parser("bench", help="measure configurations carefully (sweep, report, compare, simulate)",
                                  description="Measure serving configurations: prove the weights, sweep the draft depth, decide on the spread.")
    sub = bench.add_subparsers(dest="bench_command", metavar="COMMAND")
    bench.set_defaults(func=lambda args: (bench.print_help(sys.stderr), 2)[1])

    s = sub.add_parser("sweep", help="measure one worker at several draft depths",
                       description="Measure one worker profile at several draft depths: alternated in one worker where every configuration is a depth a request can carry, else each on a fresh worker process.")
    s.add_argument("--config", required=True, help="the fleet config (YAML or JSON)")
    s.add_argument("--worker", required=True, help="the worker profile to sweep")
    s.add_argument("--depths", default=sw.DEFAULT_DEPTHS, help=f"draft depths, e.g. `1-6` or `1,2,4` (default: {sw.DEFAULT_DEPTHS})")
    s.add_argument("--baseline", choices=("configured", "no-drafter"), default="configured",
                   help="what each depth is compared with (default: configured, the profile as written)")
    s.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help=f"measured passes per workload (default: {DEFAULT_REPEATS})")
    s.add_argument("--max-repeats", type=int, default=DEFAULT_MAX_REPEATS,
                   help=f"passes a configuration may grow to while its verdict is open (default: {DEFAULT_MAX_REPEATS})")
    s.add_argument("--workloads", default=",".join(sw.DEFAULT_WORKLOADS), help="prompt sets, measured separately (default: code,prose)")
    s.add_argument("--out", required=True, type=Path, help="directory for results.json, report.md, sweep.png and worker logs")
    s.add_argument("--max-tokens", type=int, default=sw.DEFAULT_MAX_TOKENS, help=f"output tokens per request (default: {sw.DEFAULT_MAX_TOKENS})")
    s.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help=f"win a change must clear, with its whole interval (default: {DEFAULT_MARGIN})")
    s.add_argument("--prompts-dir", type=Path, help="directory of WORKLOAD.jsonl prompt sets (default: the shipped ones)")
    s.add_argument("--startup-timeout", type=float, default=sw.DEFAULT_STARTUP_TIMEOUT, help="seconds a worker may take to load (default: 600)")
    s.add_argument("--widths", default="1",
                   help="concurrent clients per pass, e.g. `1,2,4`, each at most the worker's batch width (default: 1)")
    s.add_argument("--design", choices=sw.DESIGNS, default="auto",
                   help="alternated: every depth in one worker, each request carrying its depth, in rotating order per pass"
                        " (paired); fresh: a worker per configuration; auto (default): alternated whenever every"
                        " configuration is a depth a request can carry")
    _emit_config_option(s, "also print")
    s.set_defaults(func=run_sweep)

    r = sub.add_parser("report", help="render report.md from a results file", description="Print the report of a results file.")
    r.add_argument("results", type=Path, help="a results.json written by `mtpstack bench sweep`")
    r.add_argument("--margin", type=float, help="override the margin the sweep used")
    r.add_argument("--plot", type=Path, help="also write the figure to this PNG file")
    _emit_config_option(r, "print", ", instead of the report")
    r.set_defaults(func=run_report)

    c = sub.add_parser("compare", help="compare two results files", description="Compare B against A with the sweep's decision rule.")
    c.add_argument("a", type=Path, help="the reference results.json")
    c.add_argument("b", type=Path, help="the results.json to judge against it")
    c.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help=f"win B must clear (default: {DEFAULT_MARGIN})")
    c.set_defaults(func=run_compare)

    m = sub.add_parser("simulate", help="show how often the decision rule is fooled",
                       description="Simulate runs with a known effect and lognormal noise; print false-adopt and detection rates.")
    m.add_argument("--cv", type=float, default=sim.DEFAULT_CV, help=f"run-to-run coefficient of variation (default: {sim.DEFAULT_CV})")
    m.add_argument("--effect", type=float, default=sim.DEFAULT_EFFECT, help=f"the real win to detect (default: {sim.DEFAULT_EFFECT})")
    m.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help=f"the rule's margin (default: {DEFAULT_MARGIN})")
    m.add_argument("--repeats", default=",".join(map(str, sim.SIMULATED_REPEATS)), help="passes per side to simulate, comma-separated")
    m.add_argument("--trials", type=int, default=sim.DEFAULT_TRIALS, help=f"experiments per cell (default: {sim.DEFAULT_TRIALS})")
    m.add_argument("--resamples", type=int, default=sim.DEFAULT_RESAMPLES, help=f"bootstrap resamples (default: {sim.DEFAULT_RESAMPLES})")
    m.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    m.add_argument("--adaptive", default=f"{DEFAULT_REPEATS}:{DEFAULT_MAX_REPEATS}", metavar="N:CAP",
                   help=f"also simulate the sweep's adaptive procedure (default: {DEFAULT_REPEATS}:{DEFAULT_MAX_REPEATS}; `none` to skip)")
    m.add_argument("--design", choices=("blocks", "paired"), default="blocks",
                   help="blocks: each configuration's passes in one block, as `bench sweep` runs today (default); "
                        "paired: a pass is one pair of back-to-back runs in alternating order")
    m.add_argument("--rho", type=float, default=sim.DEFAULT_RHO,
                   help=f"paired: drift correlation between neighbouring runs (default: {sim.DEFAULT_RHO})")
    m.add_argument("--rho-from", type=Path, metavar="RUNS.json",
                   help="paired: an alternated run (`python bench/scripts/alternate.py`) whose measured rho is printed beside --rho")
    m.add_argument("--process-cv", type=float, default=0.0,
                   help="paired: spread between worker processes, for settings read at start-up (default: 0)")
    m.add_argument("--resident", action="store_true",
                   help="paired: two resident processes for the whole run, instead of a fresh process per run")
    m.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    m.set_defaults(func=run_simulate)


def _emit_config_option(parser: argparse.ArgumentParser, verb: str, tail: str = "") -> None:
    parser.add_argument("--emit-config", action="store_true",
                        help=f"{verb} the depth per workload it recommends, as a YAML and a Nix fragment to review{tail}")


def run_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from mtpstack.bench import report as rpt
    from mtpstack.bench import sweep as sw
    from mtpstack.validator import ConfigError, load_valid_config

    try:
        config = load_valid_config(args.config)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return print_error(f"the config is not valid: `{args.config}`", f"run `mtpstack validate {args.config}`")
    # A `SweepError` stops the sweep; `mtpstack.cli.main` prints it.
    settings = sw.SweepSettings(
        config_file=str(args.config), worker=args.worker, depths=sw.parse_depths(args.depths), baseline=args.baseline,
        repeats=args.repeats, max_repeats=max(args.max_repeats, args.repeats),
        workloads=[w.strip() for w in args.workloads.split(",") if w.strip()], out=args.out, design=args.design,
        max_tokens=args.max_tokens, margin=args.margin, prompts_dir=args.prompts_dir, startup_timeout=args.startup_timeout,
        widths=sw.parse_widths(args.widths, getattr(config.workers.get(args.worker), "max_num_seqs", 1)),
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("passes"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        results = sw.Sweep(config, settings, progress=progress, log=progress.console.print).run()
    paths = sw.write_outputs(results, args.out)
    print("\n".join(rpt.render_report(results)))
    if args.emit_config:
        print("\n" + "\n".join(rpt.emit_config(results)))
    print("wrote " + ", ".join(f"`{p}`" for p in paths), file=sys.stderr)
    return 1 if any(c["status"] != "measured" for c in results["configurations"]) else 0


def run_report(args: argparse.Namespace) -> int:
    from mtpstack.bench import report as rpt

    results = rpt.load_results(args.results)  # a `ResultsError` is printed by `mtpstack.cli.main`
    if args.emit_config:
        print("\n".join(rpt.emit_config(results, margin=args.margin)))
        return 0
    print("\n".join(rpt.render_report(results, margin=args.margin)))
    if args.plot:
        print(f"wrote `{rpt.plot_sweep(results, args.plot)}`", file=sys.stderr)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from mtpstack.bench import report as rpt

    a, b = rpt.load_results(args.a), rpt.load_results(args.b)
    lines = rpt.compare_lines(a, b, a_name=str(args.a), b_name=str(args.b), margin=args.margin)
    print("\n".join(lines))
    return 1 if any(line.startswith("error:") for line in lines) else 0


def run_simulate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from mtpstack.bench import simulate as sim

    try:
        repeats = sorted({int(x) for x in args.repeats.split(",") if x.strip()})
        adaptive = None if args.adaptive == "none" else tuple(int(x) for x in args.adaptive.split(":"))
        if adaptive is not None and (len(adaptive) != 2 or adaptive[0] > adaptive[1]):
            raise ValueError
    except ValueError:
        return print_error(f"cannot read `--repeats {args.repeats}` / `--adaptive {args.adaptive}`",
                           "write `--repeats 3,5,10` and `--adaptive N:CAP` with N at most CAP")
    if args.effect <= args.margin:
        return print_error(f"a win of {args.effect:.0%} can never clear the margin: {args.margin:.0%}", "raise `--effect` or lower `--margin`")
    setup = sim.Setup(cv=args.cv, effect=args.effect, margin=args.margin, trials=args.trials, resamples=args.resamples)
    if args.design == "paired":
        return _simulate_paired(args, setup, repeats, adaptive or (DEFAULT_REPEATS, DEFAULT_MAX_REPEATS))
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("simulating", total=2 * len(repeats))
        rows = sim.simulate(repeats, setup, seed=args.seed, on_step=lambda: progress.advance(task))
        adaptive_row = None
        if adaptive is not None:
            progress.update(task, description="simulating the adaptive procedure")
            adaptive_row = sim.simulate_adaptive(adaptive[0], adaptive[1], setup, seed=args.seed)
    if args.format == "json":
        print(json.dumps(sim.blocks_json(rows, adaptive_row, cv=args.cv, effect=args.effect, margin=args.margin,
                                         trials=args.trials, seed=args.seed), indent=1))
    else:
        print("\n".join(sim.format_report(rows, cv=args.cv, effect=args.effect, margin=args.margin, trials=args.trials,
                                          seed=args.seed, adaptive=adaptive_row)))
    return sim.exit_status(rows)


def _simulate_paired(args: argparse.Namespace, setup, repeats: list[int], adaptive: tuple[int, int]) -> int:
    """The paired design's simulation, at `--rho` and at the rho `--rho-from` measured."""
    from mtpstack.bench import simulate as sim
    from mtpstack.bench.stats import neighbour_correlation

    if not -1.0 < args.rho < 1.0:
        return print_error(f"`--rho` must lie strictly between -1 and 1: {args.rho}")
    measured = None
    if args.rho_from is not None:
        try:
            runs = json.loads(args.rho_from.read_text())["runs"]
            measured = neighbour_correlation([r["config"] for r in runs], [r["tok_s"] for r in runs])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return print_error(f"cannot read the alternated run `{args.rho_from}`: {e}", "write it with `python bench/scripts/alternate.py`")
    start, cap = adaptive
    if args.repeats == ",".join(map(str, sim.SIMULATED_REPEATS)):
        repeats = list(sim.PAIRED_REPEATS)
    settings = {"cv": args.cv, "rho": args.rho, "measured_rho": measured, "process_cv": args.process_cv,
                "resident": args.resident, "effect": args.effect, "margin": args.margin, "start": start, "cap": cap,
                "trials": args.trials, "seed": args.seed}
    rhos = [args.rho, *([measured] if measured is not None and -1 < measured < 1 else [])]
    found = [sim.simulate_paired(repeats, setup, rho=rho, start=start, cap=cap, process_cv=args.process_cv,
                                 resident=args.resident, seed=args.seed) for rho in rhos]
    if args.format == "json":
        out = sim.paired_json(found[0], **settings)
        if len(found) > 1:
            out["at_measured_rho"] = sim.paired_json(found[1])["passes"]
        print(json.dumps(out, indent=1))
    else:
        print("\n\n".join("\n".join(sim.format_paired_report(rows, **{**settings, "rho": rho}))
                          for rows, rho in zip(found, rhos)))
    return sim.exit_status(found[0])
