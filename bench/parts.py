"""What every benchmark script shares at its edges: its model options, the BLAS it runs under, and how it ends.

The scripts in `bench/scripts/` compose these instead of importing each other (issue 50):

- `model_options` / `check_models`: `--target`/`--drafter` (a pair of one's own, else the demo pair
  widened by `--mlp-multiplier` and `--extra-layers`) and `--depth`, spelled once;
- `ensure_preload`: re-exec under the servers' environment, so mlx in the bench's own process runs
  with the same BLAS as the servers it measures;
- `prepare_models`: the pair those options name, the demo target widened into the run's folder;
- `PROMPTS`: the short prompts of the single-stream and concurrent rounds;
- `summarize` / `fmt`: a list of samples as median, min, max and count, and that as one cell;
- `emit`: the readable table to stderr, the JSON report to `--out` (else stdout).

The servers and the streaming client are `mtpstack.bench.servers`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path


def model_options(p: argparse.ArgumentParser, *, depth: int = 3, depth_help: str = "draft depth") -> None:
    """Add the options that choose the measured pair; `check_models` checks them once parsed."""
    p.add_argument("--target", help="target model directory (default: the demo target, widened)")
    p.add_argument("--drafter", help="MTP head folder (with --target)")
    p.add_argument("--mlp-multiplier", type=int, default=8, help="widen: MLP width multiplier (default: 8)")
    p.add_argument("--extra-layers", type=int, default=10, help="widen: zero-output layers appended (default: 10)")
    p.add_argument("--depth", type=int, default=depth, help=f"{depth_help} (default: {depth})")


def check_models(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if bool(args.target) != bool(args.drafter):
        p.error("--target and --drafter go together")


def prepare_models(args, workdir: Path) -> tuple[Path, Path, str]:
    if args.target:
        return Path(args.target), Path(args.drafter), "given on the command line"
    if getattr(args, "family", None):
        from devkit.demo.tiny_families import build_bench_pair

        target, head = build_bench_pair(args.family, workdir, args.mlp_multiplier)
        return target, head, (f"the tiny random `{args.family}` pair of devkit.demo.tiny_families, its target's MLPs "
                              f"and experts widened x{args.mlp_multiplier} (function-preserving; the head unchanged)")
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    out = widen_target(DEMO_TARGET, workdir / "wide-target", args)
    return out, DEMO_HEAD, (f"the demo pair, target widened by devkit.demo.widen "
                            f"(mlp x{args.mlp_multiplier}, +{args.extra_layers} zero layers; the head is unchanged)")


def widen_target(src: Path, dest: Path, args) -> Path:
    from devkit.demo.widen import widen

    return Path(widen(src, dest, mlp_multiplier=args.mlp_multiplier, extra_layers=args.extra_layers))


def ensure_preload() -> None:
    """Re-exec under `worker_env()` so the in-process mlx-lm runs with the same BLAS as the servers."""
    from mtpstack.worker.launcher import worker_env

    env = worker_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", "") and not os.environ.get("_MTPSTACK_BENCH_REEXEC"):
        env["_MTPSTACK_BENCH_REEXEC"] = "1"
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


PROMPTS = [
    "def parse_args(argv):\n",
    "The GNU General Public License is",
    "import os\nimport sys\n\n\ndef main():\n",
    "This program is free software; you can",
]


def summarize(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s: dict, unit: str = "", digits: int = 2) -> str:
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f}, n={s['n']})"


def emit(report: dict, lines: list[str], out: str | Path | None) -> int:
    """The readable table to stderr, the JSON report to `out` (else stdout): every bench ends so."""
    print("\n".join(lines), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)
    return 0
