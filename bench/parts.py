"""What the benchmark scripts share at their edges, so that they compose these instead of importing each other: the
measured pair and its options, the BLAS re-exec, the prompts, the rounds and their order, the JSON summary of
samples, the table-and-JSON ending and a report's `meta`. Servers and the streaming client are `bench.servers`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mtpstack.bench import stats


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
    return demo_pair(workdir, args.mlp_multiplier, args.extra_layers)


def prepared_pair(args, prefix: str) -> tuple[Path, Path, Path, str]:
    """`prepare_models` in a fresh work directory, said on stderr: (the directory, target, head, what they are)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    target, head, source = prepare_models(args, workdir)
    print(f"models: {source}\n  target {target}\n  head {head}", file=sys.stderr)
    return workdir, target, head, source


def demo_pair(workdir: Path, mlp_multiplier: int, extra_layers: int, context: int | None = None) -> tuple[Path, Path, str]:
    """The demo pair, its target widened into `workdir` (as shipped at x1, +0) and its context raised to `context`."""
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    if mlp_multiplier == 1 and extra_layers == 0 and context is None:
        return Path(DEMO_TARGET), Path(DEMO_HEAD), "the shipped demo pair, as it is"
    from devkit.demo.widen import widen

    out = Path(widen(DEMO_TARGET, workdir / "wide-target", mlp_multiplier=mlp_multiplier, extra_layers=extra_layers))
    source = f"the demo pair, target widened by devkit.demo.widen (mlp x{mlp_multiplier}, +{extra_layers} zero layers; the head unchanged)"
    if context is not None:
        longer_context(out, context)
        source += f", context raised to {context} tokens"
    return out, Path(DEMO_HEAD), source


def longer_context(target: Path, tokens: int) -> None:
    """The demo is trained on 512-token windows; an agent's prompt is longer. RoPE runs past it unchanged."""
    path = target / "config.json"
    config = json.loads(path.read_text())
    for section in (config, config.get("text_config") or {}):
        if "max_position_embeddings" in section:
            section["max_position_embeddings"] = tokens
    path.write_text(json.dumps(config, indent=1))


def ensure_preload() -> None:
    """Re-exec under `worker_env()` so the in-process mlx-lm runs with the same BLAS as the servers."""
    from mtpstack.worker.launcher import worker_env

    env = worker_env()
    if env.get("LD_PRELOAD", "") != os.environ.get("LD_PRELOAD", "") and not os.environ.get("_MTPSTACK_BENCH_REEXEC"):
        env["_MTPSTACK_BENCH_REEXEC"] = "1"
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


#: Text-config dimensions of real models (from their config.json), for the predicted figure.
MODEL_DIMS = {
    # Qwen3.5-35B-A3B: 40 layers, every 4th full attention: 30 gated-delta layers.
    "qwen3.5-35b-a3b": dict(num_hidden_layers=40, full_attention_interval=4, linear_num_value_heads=32,
                            linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                            linear_conv_kernel_dim=4, num_key_value_heads=2, head_dim=256),
    # Qwen3.5-27B (and Qwen3.6-27B, the same text config): 64 layers, every 4th full attention (24 query
    # heads, gated output), 48 gated-delta layers; a dense MLP; one MTP layer.
    "qwen3.5-27b": dict(num_hidden_layers=64, full_attention_interval=4, hidden_size=5120, intermediate_size=17408,
                        vocab_size=248320, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                        linear_num_value_heads=48, linear_num_key_heads=16, linear_key_head_dim=128,
                        linear_value_head_dim=128, linear_conv_kernel_dim=4, mtp_num_hidden_layers=1),
}

PROMPTS = [
    "def parse_args(argv):\n",
    "The GNU General Public License is",
    "import os\nimport sys\n\n\ndef main():\n",
    "This program is free software; you can",
]


def spread(values: list[float]) -> dict:
    """`stats.summarize` as a report's JSON holds it: median, min, max and count; None of no values."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    s = stats.summarize(values)
    return {"median": s.median, "min": s.min, "max": s.max, "n": s.n}


def fmt(s: dict, unit: str = "", digits: int = 2, *, scale: float = 1.0, sep: str = "-", count: bool = True,
        missing: str = "n/a") -> str:
    """`median (min-max, n=N)`, each times `scale`; `count=False` leaves out the `n`."""
    if not s or s.get("median") is None:
        return missing
    lo, mid, hi = (f"{s[k] * scale:.{digits}f}" for k in ("min", "median", "max"))
    return f"{mid}{unit} ({lo}{sep}{hi}" + (f", n={s['n']})" if count else ")")


def emit(report: dict, lines: list[str], out: str | Path | None) -> int:
    """The readable table to stderr, the JSON report to `out` (else stdout): every bench ends so."""
    print("\n".join(lines), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)
    return 0


def command_line() -> str:
    """This run's command, as a report records it."""
    return " ".join([Path(sys.executable).name, *sys.argv])


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def loadavg() -> list[float] | None:
    """1, 5 and 15 minute load averages: a busy machine explains a wide spread."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def git(*args: str) -> str | None:
    """`git ARGS` run in this checkout: its output, None where it failed."""
    try:
        done = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), *args], capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def run_meta(*, checkout: bool = False, **fields) -> dict:
    """A report's `meta`: the command, `fields`, the machine, the BLAS preloaded and the versions it ran with;
    `checkout`: also its commit and the tracked files changed (a shared checkout runs what is on disk, not HEAD)."""
    meta = {"command": command_line(), **fields, "machine": platform.machine(), "cpus": os.cpu_count(),
            "ld_preload": os.environ.get("LD_PRELOAD"), "loadavg": loadavg(),
            "versions": {"mlx": version_of("mlx"), "mlx_lm": version_of("mlx-lm"), "mlx_vlm": version_of("mlx-vlm")},
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if checkout:
        changed = (git("status", "--porcelain", "--untracked-files=no") or "").splitlines()
        meta.update(commit=(git("rev-parse", "--short", "HEAD") or "").strip() or "?",
                    modified=[line[3:] for line in changed])
    return meta


def rotated(items: list, k: int) -> list:
    """`items` starting at its `k`-th (modulo its length): round k's order, so drift hits every item alike."""
    k %= len(items)
    return items[k:] + items[:k]


def rounds(warmup: int, repeats: int):
    """Each round's number and whether it is kept (not one of the first `warmup`), a line on stderr after it."""
    total = warmup + repeats
    for rnd in range(total):
        yield rnd, rnd >= warmup
        print(f"round {rnd + 1}/{total} done" + ("" if rnd >= warmup else " (warm-up, discarded)"), file=sys.stderr)


def post_json(url: str, path: str, body: dict, timeout: float = 600) -> dict:
    """One JSON request, its JSON answer (blocking: for scripts that time one request at a time)."""
    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def few_repeats(repeats: int, enough: int = 5) -> list[str]:
    """The note a report carries when its rounds are too few to tell a small difference from noise."""
    if repeats >= enough:
        return []
    return [f"only {repeats} repeats on a shared machine: treat ratios within ~10% as noise; rerun with --repeats "
            f"{enough} or more"]


def round_options(p: argparse.ArgumentParser, *, repeats: int, max_tokens: int = 64) -> None:
    """Add the options of a bench measured in rounds: tokens per request, rounds kept and discarded, the JSON's file."""
    p.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens per request (default: {max_tokens})")
    p.add_argument("--repeats", type=int, default=repeats, help=f"measured rounds (default: {repeats})")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default: 1)")
    p.add_argument("--out", help="write the JSON here instead of stdout")
