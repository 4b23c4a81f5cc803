"""What every benchmark script shares at its edges: its model options, the BLAS it runs under, and how it ends.

The scripts in `bench/scripts/` compose these instead of importing each other (issue 50):

- `model_options` / `check_models`: `--target`/`--drafter` (a pair of one's own, else the demo pair
  widened by `--mlp-multiplier` and `--extra-layers`) and `--depth`, spelled once;
- `ensure_preload`: re-exec under the servers' environment, so mlx in the bench's own process runs
  with the same BLAS as the servers it measures;
- `emit`: the readable table to stderr, the JSON report to `--out` (else stdout).
"""

from __future__ import annotations

import argparse
import json
import os
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


def ensure_preload() -> None:
    """Re-exec under `worker_env()` so the in-process mlx-lm runs with the same BLAS as the servers."""
    from mtpstack.worker.launcher import worker_env

    env = worker_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", "") and not os.environ.get("_MTPSTACK_BENCH_REEXEC"):
        env["_MTPSTACK_BENCH_REEXEC"] = "1"
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def emit(report: dict, lines: list[str], out: str | Path | None) -> int:
    """The readable table to stderr, the JSON report to `out` (else stdout): every bench ends so."""
    print("\n".join(lines), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)
    return 0
