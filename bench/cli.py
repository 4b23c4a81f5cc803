"""`mtpstack bench sweep|report|compare|simulate`: `sweep` writes raw passes to `results.json` (and renders from it),
`report` and `compare` only read result files. Data goes to stdout, progress and errors to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mtpstack.bench import report as rpt
from mtpstack.bench import simulate as sim
from mtpstack.bench import sweep as sw
from mtpstack.bench.stats import DEFAULT_MARGIN, DEFAULT_MAX_REPEATS, DEFAULT_REPEATS, neighbour_correlation
from mtpstack.errors import print_error
from mtpstack.validator import ConfigError, load_valid_config


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="measure configurations carefully (sweep, report, compare, simulate)",
                                  description="Measure serving configurations: prove the weights, sweep the draft"
                                              " depth, decide on the spread.")
    sub = bench.add_subparsers(dest="bench_command", metavar="COMMAND")
    bench.set_defaults(func=lambda args: (bench.print_help(sys.stderr), 2)[1])
    emit = "the depth per workload it recommends, as a YAML and a Nix fragment to review"
    margin = ("--margin", "win a change must clear, with its whole interval",
              {"type": float, "default": DEFAULT_MARGIN})
    commands = {
        ("sweep", run_sweep, "measure one worker at several draft depths",
         "Measure one worker profile at several draft depths: alternated in one worker where every configuration is a"
         " depth a request can carry, else each on a fresh worker process."): [
            ("--config", "the fleet config (YAML or JSON)", {"required": True}),
            ("--worker", "the worker profile to sweep", {"required": True}),
            ("--depths", "draft depths, e.g. `1-6` or `1,2,4`", {"default": sw.DEFAULT_DEPTHS}),
            ("--baseline", "what each depth is compared with; `configured` is the profile as written",
             {"choices": ("configured", "no-drafter"), "default": "configured"}),
            ("--repeats", "measured passes per workload", {"type": int, "default": DEFAULT_REPEATS}),
            ("--max-repeats", "passes a configuration may grow to while its verdict is open",
             {"type": int, "default": DEFAULT_MAX_REPEATS}),
            ("--workloads", "prompt sets, measured separately", {"default": ",".join(sw.DEFAULT_WORKLOADS)}),
            ("--out", "directory for results.json, report.md, sweep.png and worker logs",
             {"required": True, "type": Path}),
            ("--max-tokens", "output tokens per request", {"type": int, "default": sw.DEFAULT_MAX_TOKENS}),
            margin,
            ("--prompts-dir", "directory of WORKLOAD.jsonl prompt sets (default: the shipped ones)", {"type": Path}),
            ("--startup-timeout", "seconds a worker may take to load",
             {"type": float, "default": sw.DEFAULT_STARTUP_TIMEOUT}),
            ("--widths", "concurrent clients per pass, e.g. `1,2,4`, each at most the worker's batch width",
             {"default": "1"}),
            ("--design", "alternated: every depth in one worker, each request carrying its depth, in rotating order"
             " per pass (paired); fresh: a worker per configuration; auto: alternated whenever every configuration"
             " is a depth a request can carry", {"choices": sw.DESIGNS, "default": "auto"}),
            ("--emit-config", "also print " + emit, {"action": "store_true"}),
        ],
        ("report", run_report, "render report.md from a results file", "Print the report of a results file."): [
            ("results", "a results.json written by `mtpstack bench sweep`", {"type": Path}),
            ("--margin", "override the margin the sweep used", {"type": float}),
            ("--plot", "also write the figure to this PNG file", {"type": Path}),
            ("--emit-config", f"print {emit}, instead of the report", {"action": "store_true"}),
        ],
        ("compare", run_compare, "compare two results files", "Compare B against A with the sweep's decision rule."): [
            ("a", "the reference results.json", {"type": Path}),
            ("b", "the results.json to judge against it", {"type": Path}),
            margin,
        ],
        ("simulate", run_simulate, "show how often the decision rule is fooled",
         "Simulate runs with a known effect and lognormal noise; print false-adopt and detection rates."): [
            ("--cv", "run-to-run coefficient of variation", {"type": float, "default": sim.DEFAULT_CV}),
            ("--effect", "the real win to detect", {"type": float, "default": sim.DEFAULT_EFFECT}),
            margin,
            ("--repeats", "passes per side to simulate, comma-separated",
             {"default": ",".join(map(str, sim.SIMULATED_REPEATS))}),
            ("--trials", "experiments per cell", {"type": int, "default": sim.DEFAULT_TRIALS}),
            ("--resamples", "bootstrap resamples", {"type": int, "default": sim.DEFAULT_RESAMPLES}),
            ("--seed", "random seed", {"type": int, "default": 0}),
            ("--adaptive", "also simulate the sweep's adaptive procedure; `none` to skip",
             {"default": f"{DEFAULT_REPEATS}:{DEFAULT_MAX_REPEATS}", "metavar": "N:CAP"}),
            ("--design", "blocks: each configuration's passes in one block, as `bench sweep --design fresh` runs;"
             " paired: a pass is one pair of back-to-back runs in alternating order",
             {"choices": ("blocks", "paired"), "default": "blocks"}),
            ("--rho", "paired: drift correlation between neighbouring runs",
             {"type": float, "default": sim.DEFAULT_RHO}),
            ("--rho-from", "paired: an alternated run (`python bench/scripts/alternate.py`) whose measured rho is"
             " printed beside --rho", {"type": Path, "metavar": "RUNS.json"}),
            ("--process-cv", "paired: spread between worker processes, for settings read at start-up",
             {"type": float, "default": 0.0}),
            ("--resident", "paired: two resident processes for the whole run, instead of a fresh process per run",
             {"action": "store_true"}),
            ("--format", "output format", {"choices": ("text", "json"), "default": "text"}),
        ],
    }
    for (name, func, summary, description), options in commands.items():
        parser = sub.add_parser(name, help=summary, description=description)
        for flag, text, kw in options:
            default = f" (default: {kw['default']})" if "default" in kw else ""
            parser.add_argument(flag, help=text + default, **kw)
        parser.set_defaults(func=func)


def run_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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
    results = rpt.load_results(args.results)  # a `ResultsError` is printed by `mtpstack.cli.main`
    print("\n".join((rpt.emit_config if args.emit_config else rpt.render_report)(results, margin=args.margin)))
    if args.plot and not args.emit_config:
        print(f"wrote `{rpt.plot_sweep(results, args.plot)}`", file=sys.stderr)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    a, b = rpt.load_results(args.a), rpt.load_results(args.b)
    lines = rpt.compare_lines(a, b, a_name=str(args.a), b_name=str(args.b), margin=args.margin)
    print("\n".join(lines))
    return 1 if any(line.startswith("error:") for line in lines) else 0


def run_simulate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    try:
        repeats = sorted({int(x) for x in args.repeats.split(",") if x.strip()})
        adaptive = None if args.adaptive == "none" else tuple(int(x) for x in args.adaptive.split(":"))
        if adaptive is not None and (len(adaptive) != 2 or adaptive[0] > adaptive[1]):
            raise ValueError
    except ValueError:
        return print_error(f"cannot read `--repeats {args.repeats}` / `--adaptive {args.adaptive}`",
                           "write `--repeats 3,5,10` and `--adaptive N:CAP` with N at most CAP")
    if args.effect <= args.margin:
        return print_error(f"a win of {args.effect:.0%} can never clear the margin: {args.margin:.0%}",
                           "raise `--effect` or lower `--margin`")
    setup = sim.Setup(cv=args.cv, effect=args.effect, margin=args.margin, trials=args.trials, resamples=args.resamples)
    common = {"cv": args.cv, "effect": args.effect, "margin": args.margin, "trials": args.trials, "seed": args.seed}
    if args.design == "paired":
        return _simulate_paired(args, setup, repeats, adaptive or (DEFAULT_REPEATS, DEFAULT_MAX_REPEATS), common)
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("simulating", total=2 * len(repeats))
        rows = sim.simulate(repeats, setup, seed=args.seed, on_step=lambda: progress.advance(task))
        adaptive_row = None
        if adaptive is not None:
            progress.update(task, description="simulating the adaptive procedure")
            adaptive_row = sim.simulate_adaptive(adaptive[0], adaptive[1], setup, seed=args.seed)
    if args.format == "json":
        print(json.dumps(sim.blocks_json(rows, adaptive_row, **common), indent=1))
    else:
        print("\n".join(sim.format_report(rows, adaptive=adaptive_row, **common)))
    return sim.exit_status(rows)


def _simulate_paired(args: argparse.Namespace, setup, repeats: list[int], adaptive: tuple[int, int], common) -> int:
    """The paired design's simulation, at `--rho` and at the rho `--rho-from` measured."""
    if not -1.0 < args.rho < 1.0:
        return print_error(f"`--rho` must lie strictly between -1 and 1: {args.rho}")
    measured = None
    if args.rho_from is not None:
        try:
            runs = json.loads(args.rho_from.read_text())["runs"]
            measured = neighbour_correlation([r["config"] for r in runs], [r["tok_s"] for r in runs])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return print_error(f"cannot read the alternated run `{args.rho_from}`: {e}",
                               "write it with `python bench/scripts/alternate.py`")
    start, cap = adaptive
    if args.repeats == ",".join(map(str, sim.SIMULATED_REPEATS)):
        repeats = list(sim.PAIRED_REPEATS)
    settings = {**common, "rho": args.rho, "measured_rho": measured, "process_cv": args.process_cv,
                "resident": args.resident, "start": start, "cap": cap}
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
