"""Speculation's extra memory per row per drafted position, measured against what the state sizes predict.

    LD_PRELOAD=.../libblas.so.3 .venv/bin/python bench/scripts/step_memory.py [--depths 1 2 4] [--widths 1 4] [--repeats 7]

A verify step of a hybrid target keeps, beyond a plain step, what sets each row's gated-delta state
after its kept positions (`mtpstack.worker.caches.StepRecord`), in one of two ways:
- where mlx-lm's recurrence is a loop of one op a position (the CPU), the state after every position:
  `linear layers x value heads x key dim x value dim x 4` bytes (fp32) per row per drafted position;
- where it is one Metal kernel over all positions (`--replayed` runs that way here, through mlx-lm's
  ops), only the recurrence's inputs (q, k, v: `conv_dim` values, and two gates per value head) per
  drafted position, and at commit one replayed state per row that rejected drafts, whatever the depth
  (1/k of one per drafted position);
plus, either way, a conv window's input (`conv_dim` values) and the attention layers' KV, both small. This script
builds a tiny Qwen3.5-family target widened where that state lives (more and larger linear heads),
runs real decode steps at each width and depth, and reports the peak memory in use during one step
(mlx's peak counter, reset before each step) above the depth-0 step's, per row per drafted position,
next to the prediction: median and min-max over `--repeats` steps. `predicted_bytes` also gives the
figures at a real model's dimensions (`--model-dims qwen3.5-35b-a3b`). A benchmark, not a test.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from mtpstack.bench.parts import MODEL_DIMS, emit

#: The widened tiny target: small everywhere except the linear-attention state.
WIDE = dict(hidden_size=64, num_hidden_layers=8, intermediate_size=128, full_attention_interval=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=8,
            linear_num_value_heads=16, linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4)


def predicted_bytes(text: dict, depth: int = 1, replayed: bool = False) -> dict[str, float]:
    """Bytes one row keeps per drafted position at `depth`: the recurrent state (fp32) after the position,
    or (`replayed`) the recurrence's inputs and one replayed state per row whatever the depth (1/depth of
    it); either way the conv window's input and the attention KV (bf16)."""
    layers = text["num_hidden_layers"]
    linear = layers - layers // text["full_attention_interval"]
    attention = layers - linear
    state = linear * text["linear_num_value_heads"] * text["linear_key_head_dim"] * text["linear_value_head_dim"] * 4
    conv_dim = 2 * text["linear_num_key_heads"] * text["linear_key_head_dim"] + text["linear_num_value_heads"] * text["linear_value_head_dim"]
    conv = linear * conv_dim * 2
    inputs = linear * (conv_dim + 2 * text["linear_num_value_heads"]) * 2 if replayed else 0
    state = state / depth if replayed else state
    kv = attention * 2 * text["num_key_value_heads"] * text["head_dim"] * 2
    return {"state": state, "conv": conv, "inputs": inputs, "kv": kv, "total": state + conv + inputs + kv}


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def build_pair(out: Path) -> tuple[Path, Path]:
    import mlx.core as mx

    from devkit.demo.modeldir import build_head, build_qwen3_5, head_config, qwen3_5_config, qwen3_5_text_config, save_head_dir, save_model_dir

    mx.random.seed(0)
    config = qwen3_5_config(qwen3_5_text_config(**WIDE))
    target = build_qwen3_5(config)
    hconfig = head_config(config["text_config"])
    head = build_head(hconfig)
    return save_model_dir(target, config, out / "target"), save_head_dir(head, hconfig, out / "mtp")


def step_peaks(engine, width: int, depth: int, repeats: int) -> list[int]:
    """Peak bytes in use during each of `repeats` decode steps of `width` rows at `depth`."""
    import mlx.core as mx

    from mtpstack.worker.scheduler import Scheduler
    from mtpstack.worker.sequence import SamplingParams

    prompts = ["def main():", "import os\n", "The quick brown fox", "x = 1\n"]
    sched = Scheduler(max_num_seqs=width)
    for i in range(width):
        sched.add(engine.new_sequence(engine.text_prompt(prompts[i % 4]),
                                      SamplingParams(max_tokens=10_000, depth=depth, ignore_eos=True)))
    while any(not seq.in_batch for seq in sched.active):
        sched.step()
    for _ in range(2):  # warm-up steps, discarded
        sched.step()
    peaks = []
    for _ in range(repeats):
        # The absolute peak: what a step leaves lazily referenced (a commit is evaluated by the next
        # step) is part of what speculation costs, so nothing is subtracted but the depth-0 step's peak.
        mx.synchronize()
        mx.reset_peak_memory()
        sched.step()
        mx.synchronize()
        peaks.append(mx.get_peak_memory())
    return peaks


def measure(depths: list[int], widths: list[int], repeats: int, replayed: bool = False) -> dict:
    from mtpstack.worker.loading import Engine

    with tempfile.TemporaryDirectory() as tmp:
        target, head = build_pair(Path(tmp))
        engine = Engine.load(str(target), str(head), draft_depth=max(depths))
        rows = []
        for width in widths:
            base = statistics.median(step_peaks(engine, width, 0, repeats))
            for depth in depths:
                predicted = predicted_bytes(engine.target.config["text_config"], depth, replayed)["total"]
                extra = [(p - base) / (width * depth) for p in step_peaks(engine, width, depth, repeats)]
                rows.append({"width": width, "depth": depth, "median": statistics.median(extra), "min": min(extra),
                             "max": max(extra), "predicted": predicted, "ratio": statistics.median(extra) / predicted})
    return {"dims": WIDE, "repeats": repeats, "replayed": replayed, "rows": rows}


def table(report: dict) -> list[str]:
    lines = [f"{'width':>5} {'depth':>5} {'measured median':>16} {'min-max':>24} {'predicted':>12} {'ratio':>6}"]
    for r in report["rows"]:
        lines.append(f"{r['width']:>5} {r['depth']:>5} {mib(r['median']):>16} {mib(r['min']) + ' - ' + mib(r['max']):>24} "
                     f"{mib(r['predicted']):>12} {r['ratio']:>6.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--widths", type=int, nargs="+", default=[1, 4])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--replayed", action="store_true", help="run the gated-delta layers as on Metal (one call a step, "
                   "rejected rows replayed at commit) through mlx-lm's ops, and predict that")
    p.add_argument("--model-dims", choices=list(MODEL_DIMS), help="print the predicted figures at a real model's dimensions and exit")
    p.add_argument("--out", help="write the JSON report here (default: stdout)")
    args = p.parse_args(argv)
    if args.model_dims:
        dims = MODEL_DIMS[args.model_dims]
        kept = predicted_bytes(dims)
        print(f"{args.model_dims}, every position's state kept: {mib(kept['total'])} per row per drafted position "
              f"(recurrent state {mib(kept['state'])}, conv window {mib(kept['conv'])}, attention KV {mib(kept['kv'])})")
        for depth in args.depths:
            b = predicted_bytes(dims, depth, replayed=True)
            print(f"{args.model_dims}, replayed, depth {depth}: {mib(b['total'])} per row per drafted position (one "
                  f"replayed state {mib(b['state'] * depth)} a row, conv window {mib(b['conv'])}, the recurrence's "
                  f"inputs {mib(b['inputs'])}, attention KV {mib(b['kv'])} a position)")
        return 0
    if args.replayed:
        import mtpstack.worker.caches as caches

        caches._runs_kernel = lambda k: True
    report = measure(args.depths, args.widths, args.repeats, args.replayed)
    return emit(report, table(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
