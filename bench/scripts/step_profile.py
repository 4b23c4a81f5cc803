"""Where one speculative decode step's time goes: part by part, at each depth and width, on two hybrid pairs.

    LD_PRELOAD=.../libblas.so.3 .venv/bin/python bench/scripts/step_profile.py \\
        [--pairs demo qwen3_5] [--depths 0 1 2 3 4] [--widths 1 4] [--repeats 4] [--steps 4] [--out FILE]
    LD_PRELOAD=.../libblas.so.3 .venv/bin/python bench/scripts/step_profile.py --memory \\
        [--depths 1 2 4] [--repeats 7] [--replayed]

Each configuration (pair, width, depth; depth 0 the plain step) decodes `width` rows greedily in the worker's
own batch; the pairs are `parts.prepare_models`'s, `demo` (target widened to ~70M parameters) or a family's tiny
pair (target MLPs widened x8, where per-step overhead dominates). Each round rebuilds every configuration's rows,
then times `--steps` rotated sweeps as served (beside each step the floor: the target's forward alone over as many
positions) and `--steps` with evaluation forced at every boundary of `PARTS` (which changes the total). Step cost:
the median unforced step over the plain step's, same pair, width and round (also in CPU time; the floor's over the
forward over one position); median (min-max) over rounds. Method and figures: docs/worker.md, "Per part,
in-process".

`--memory`: speculation's extra memory per row per drafted position on a tiny Qwen3.5 target widened where the
gated-delta state lives (`WIDE`): one step's peak (mlx's counter) above the depth-0 step's, beside
`predicted_bytes` (docs/worker.md, "Speculation's memory"); `--replayed` runs the gated-delta layers as on
Metal. `--model-dims MODEL`: the figures at a real model's dimensions on paper (`paper_step`; with `--memory`,
`predicted_bytes`), and exit.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from mtpstack.bench.parts import (MODEL_DIMS, PROMPTS, command_line, emit, ensure_preload, fmt, loadavg,
                                  prepare_models, rotated, rounds, spread as span_of)
from mtpstack.bench.stats import summarize

#: A step's parts in the order they run: `draft` (the head's forwards and the target's LM head on each), `verify`
#: (the target over 1 + k positions, less the gated-delta / Mamba2 `recurrence`), `lm head`, `sample+accept`,
#: `commit` (each row's kept recurrent state and conv window), `head replay` (the head's accept step: rollback,
#: replay, next seed), `other` (inputs, text, bookkeeping: what the timed parts leave of the forced total).
PARTS = ("draft", "verify", "recurrence", "lm head", "sample+accept", "commit", "head replay", "other")
#: The recurrences by the names the worker's modules import them as (`_states_ops`: the CPU's per-position loop).
RECURRENCES = ("gated_delta_update", "_states_ops", "ssm_update")
#: Steps run and discarded after a configuration's rows are rebuilt.
WARMUP_STEPS = 2
#: A row's figures, each kept over rounds (`<name>_raw`) beside its spread.
RAW = ("step_ms", "step_cost", "cpu_cost", "floor_cost", "forced_ms")


class Timeline:
    """A forced step's parts, timed exclusive of the parts nested in them (so they add up to the time covered)."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.totals: dict[str, float] = {}
        self.spans: list[tuple[str, float, float]] = []  # (part, start, end) of the outermost parts
        self._stack: list[list] = []  # [part, start, nested seconds]

    def enter(self, part: str) -> None:
        self._stack.append([part, self.clock(), 0.0])

    def leave(self, part: str) -> None:
        name, start, nested = self._stack.pop()
        assert name == part, (name, part)
        end = self.clock()
        self.add(part, end - start - nested)
        if self._stack:
            self._stack[-1][2] += end - start
        else:
            self.spans.append((part, start, end))

    def add(self, part: str, seconds: float) -> None:
        self.totals[part] = self.totals.get(part, 0.0) + seconds

    def current(self) -> str | None:
        return self._stack[-1][0] if self._stack else None


def step_parts(timeline: Timeline, total: float) -> dict[str, float]:
    """Seconds per part of a forced step of `total` seconds; `sample+accept` is the gap from the last LM-head
    span to the first commit after it, `other` the rest."""
    parts = {part: 0.0 for part in PARTS}
    parts.update({p: s for p, s in timeline.totals.items() if p in parts})
    head_end = [end for part, _, end in timeline.spans if part.startswith("lm head")]
    if head_end:
        commits = [start for part, start, _ in timeline.spans if part.startswith("commit") and start >= head_end[-1]]
        if commits:
            parts["sample+accept"] = commits[0] - head_end[-1]
    parts["other"] = max(0.0, total - sum(v for p, v in parts.items() if p != "other"))
    return parts


def step_cost_rounds(rounds: list[dict], depth: int) -> list[float]:
    """Per round, the median unforced step at `depth` over the plain step's (depth 0) median, same round."""
    return [summarize(r[depth]).median / summarize(r[0]).median for r in rounds if depth in r and r.get(0)]


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    return fmt(span_of(values), digits=digits, scale=scale, count=False)


def table(report: dict) -> list[str]:
    lines = ["one decode step, in-process, greedy; ms median (min-max) over rounds; 'forced': evaluation forced at "
             "every part boundary (profiling mode, changes the total), parts as build+eval ms"]
    head = (f"    {'depth':>5} {'step (unforced)':>22} {'step cost':>18} {'cpu time':>18} {'floor':>18} "
            f"{'tokens/step':>11} {'forced':>20}   parts (forced, build+eval ms)")
    for pair in report["pairs"]:
        lines.append(f"pair {pair['name']}: {pair['models']}")
        for width in pair["widths"]:
            lines += [f"  width {width['width']}", head]
            for row in width["depths"]:
                parts = "  ".join(f"{p} {t['build_ms']:.1f}+{t['eval_ms']:.1f}" for p, t in row["parts"].items()
                                  if t["build_ms"] + t["eval_ms"] >= 0.05)
                lines.append(f"    {row['depth']:>5} {row['step_ms']:>22} {row['step_cost']:>18} {row['cpu_cost']:>18} "
                             f"{row['floor_cost']:>18} {row['tokens_per_step']:>11.2f} {row['forced_ms']:>20}   "
                             + parts)
    lines.append(f"load average before / after: {report['loadavg'][0]} / {report['loadavg'][1]}")
    return lines


class Forcing:
    """Profiling mode on one batch: the parts' callables wrapped to force evaluation at their boundaries, found
    by the names every version of the worker exposes, so one profile runs before and after a change."""

    def __init__(self, engine, batch):
        self.engine, self.batch = engine, batch
        self.timeline = Timeline()
        self._patches = contextlib.ExitStack()

    def _timed(self, part: str, fn, *, eval_inputs: bool = False, after=None):
        import mlx.core as mx

        timeline = self.timeline

        def wrapper(*args, **kwargs):
            if eval_inputs and timeline.current():  # what the inputs still owe is the enclosing part's work
                start = timeline.clock()
                mx.eval(args, kwargs)
                timeline.add(timeline.current() + " eval", timeline.clock() - start)
            timeline.enter(part)
            out = fn(*args, **kwargs)
            built = timeline.clock()
            mx.eval(out)
            if after is not None:
                after()
            timeline.add(part + " eval", timeline.clock() - built)
            timeline.leave(part)
            return out

        return wrapper

    def _patch(self, owner, name: str, part: str, **timing) -> None:
        self._patches.enter_context(mock.patch.object(owner, name, self._timed(part, getattr(owner, name), **timing)))

    def __enter__(self) -> "Forcing":
        import mlx.core as mx
        from mlx_lm.models import ssm

        parts, drafter, caches = self.engine.parts, self.batch.drafter, self.batch.caches
        self._patch(parts, "hidden", "verify")
        self._patch(parts, "lm_head", "lm head")
        if drafter is not None:
            # What a drafter leaves lazy (its caches, a head's next seed) is forced with the part that made it.
            def drafter_state():
                mx.eval([c.state for c in drafter.caches], drafter.arrays(self.batch.rows))

            self._patch(drafter, "draft", "draft", after=drafter_state)
            self._patch(drafter, "accept", "head replay", after=drafter_state)
        for i, cache in enumerate(caches):
            last = i == len(caches) - 1
            self._patch(cache, "commit", "commit", after=(lambda: mx.eval([c.state for c in caches])) if last else None)
        for module in [m for name, m in list(sys.modules.items()) if name.startswith("mtpstack.worker") and m is not None]:
            for name in RECURRENCES:
                if callable(getattr(module, name, None)):
                    self._patch(module, name, "recurrence", eval_inputs=True)
        self._patch(ssm, "ssm_update", "recurrence", eval_inputs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._patches.close()


def decode_rows(engine, width: int, depth: int, prompts: list[str] = PROMPTS):
    """`width` rows of the worker's batch (`Scheduler`, as served) decoding at `depth`, prompts in, warmed up."""
    from mtpstack.worker.scheduler import Scheduler
    from mtpstack.worker.sequence import SamplingParams

    sched = Scheduler(max_num_seqs=width)
    for i in range(width):
        sched.add(engine.new_sequence(engine.text_prompt(prompts[i % len(prompts)]),
                                      SamplingParams(max_tokens=100_000, depth=depth, ignore_eos=True)))
    while any(not seq.in_batch for seq in sched.active):
        sched.step()
    for _ in range(WARMUP_STEPS):
        sched.step()
    return sched


def floor(engine, width: int, positions: int):
    """A timer of the least a verify over `positions` new tokens a row can cost: the target's forward alone
    (mlx-lm's caches, no rollback, head or sampling), each call from the same prefilled context."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    parts, cache = engine.parts, make_prompt_cache(engine.target.model)
    context = engine.text_prompt(" ".join(PROMPTS))[:32]
    mx.eval(parts.hidden(mx.array([context] * width), cache))
    saved = [list(c.cache) if hasattr(c, "cache") else None for c in cache]
    mx.eval([c.state for c in cache])
    tokens = mx.array([[5] * positions] * width, dtype=mx.uint32)

    def step() -> float:
        start = time.perf_counter()
        mx.eval(parts.lm_head(parts.hidden(tokens, cache)))
        elapsed = time.perf_counter() - start
        for c, kept in zip(cache, saved):
            if kept is None:
                c.trim(positions)
            else:
                c.cache = list(kept)
        return elapsed

    return step


def measure_round(engines: dict, configs: list, steps: int, rnd: int) -> dict:
    """One round of every configuration, as the module's docstring says: unforced sweeps, then forced ones."""
    import mlx.core as mx

    scheds = {c: decode_rows(engines[c[0]], c[1], c[2]) for c in configs}
    floors = {c: floor(engines[c[0]], c[1], 1 + c[2]) for c in configs}
    out = {c: {"unforced": [], "cpu": [], "forced": [], "parts": [], "floor": [], "tokens": 0} for c in configs}
    order = [c for sweep in range(steps) for c in rotated(configs, rnd * steps + sweep)]
    for c in order:
        o, start, cpu = out[c], time.perf_counter(), time.process_time()
        results = scheds[c].step()
        o["unforced"].append(time.perf_counter() - start)
        o["cpu"].append(time.process_time() - cpu)
        o["tokens"] += sum(r.tokens for _, r, _ in results if r is not None)
        o["floor"].append(floors[c]())
    for c in configs:
        mx.eval([cache.state for cache in scheds[c].batch.caches])  # nothing lazy carried into the forced steps
    for c in order:
        with Forcing(engines[c[0]], scheds[c].batch) as forcing:
            start = time.perf_counter()
            scheds[c].step()
            total = time.perf_counter() - start
        out[c]["forced"].append(total)
        exclusive = step_parts(forcing.timeline, total)
        evals = {p: forcing.timeline.totals.get(p + " eval", 0.0) for p in PARTS}
        out[c]["parts"].append({p: {"build": exclusive[p] - evals[p], "eval": evals[p]} for p in PARTS})
    for c in configs:
        out[c]["tokens_per_step"] = out[c].pop("tokens") / (steps * c[1])
    return out


def measure(args) -> dict:
    """Every round a report of its own, merged as `--merge` merges runs."""
    from mtpstack.worker.loading import Engine

    depths = sorted(set(args.depths) | {0})
    reports = []
    with tempfile.TemporaryDirectory(prefix="step-profile-") as tmp:
        engines, sources = {}, {}
        for name in args.pairs:
            pair_args = argparse.Namespace(target=None, family=None if name == "demo" else name,
                                           mlp_multiplier=args.mlp_multiplier, extra_layers=args.extra_layers)
            target, head, sources[name] = prepare_models(pair_args, Path(tmp) / name)
            engines[name] = Engine.load(str(target), str(head), draft_depth=max(depths))
        configs = [(p, w, d) for p in args.pairs for w in args.widths for d in depths]
        for rnd, _ in rounds(0, args.repeats):
            started, run = loadavg(), measure_round(engines, configs, args.steps, rnd)
            pairs = [{"name": name, "models": sources[name], "widths": [
                {"width": w, "depths": [depth_row(run, (name, w), d) for d in depths]} for w in args.widths]}
                for name in args.pairs]
            reports.append({"command": command_line(), "repeats": 1, "steps": args.steps,
                            "loadavg": [started, loadavg()], "pairs": pairs})
    return merge(reports)


def depth_row(run: dict, pair_width: tuple, depth: int) -> dict:
    """A depth's row of one round: its steps' medians and its costs over the plain step's."""
    this, by_depth = run[(*pair_width, depth)], {d: v for (*pw, d), v in run.items() if tuple(pw) == pair_width}
    raw = {"step_ms": [summarize(this["unforced"]).median], "forced_ms": [summarize(this["forced"]).median]}
    for name, key in (("step_cost", "unforced"), ("cpu_cost", "cpu"), ("floor_cost", "floor")):
        raw[name] = step_cost_rounds([{d: v[key] for d, v in by_depth.items()}], depth)
    parts = {p: {k + "_ms": summarize([s[p][k] for s in this["parts"]]).median * 1e3 for k in ("build", "eval")}
             for p in PARTS}
    return row_of(depth, raw, parts, this["tokens_per_step"])


def row_of(depth: int, raw: dict[str, list[float]], parts: dict, tokens_per_step: float) -> dict:
    row = {"depth": depth, "parts": parts, "tokens_per_step": tokens_per_step}
    for key in RAW:
        row[key + "_raw"] = raw[key]
        row[key] = spread(raw[key], 1e3 if key.endswith("_ms") else 1.0)
    return row


def merge(reports: list[dict]) -> dict:
    """Reports of the same configurations (e.g. single rounds alternated with another build's) as one: every
    round's values together, the parts' medians over the reports."""
    first = reports[0]

    def merged(p: int, w: int, d: int, row: dict) -> dict:
        same = [r["pairs"][p]["widths"][w]["depths"][d] for r in reports]
        if any(x["depth"] != row["depth"] for x in same):
            raise ValueError("the reports do not measure the same configurations")
        parts = {part: {k: summarize([x["parts"][part][k] for x in same]).median for k in row["parts"][part]}
                 for part in PARTS}
        raw = {key: [v for x in same for v in x[key + "_raw"]] for key in RAW}
        return row_of(row["depth"], raw, parts, summarize([x["tokens_per_step"] for x in same]).median)

    pairs = [{"name": pair["name"], "models": pair["models"], "widths": [
        {"width": width["width"], "depths": [merged(p, w, d, row) for d, row in enumerate(width["depths"])]}
        for w, width in enumerate(pair["widths"])]} for p, pair in enumerate(first["pairs"])]
    return {"command": first["command"], "repeats": sum(r["repeats"] for r in reports), "steps": first["steps"],
            "loadavg": [first["loadavg"][0], reports[-1]["loadavg"][-1]], "pairs": pairs}


def hybrid_sizes(dims: dict) -> dict:
    """A hybrid target's gated-delta and attention layer counts, a gated-delta layer's recurrent state (fp32
    bytes, one row) and its conv width (`conv_dim`)."""
    layers = dims["num_hidden_layers"]
    linear = layers - layers // dims["full_attention_interval"]
    hv, hk, dk, dv = (dims[k] for k in ("linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
                                         "linear_value_head_dim"))
    return {"linear": linear, "attention": layers - linear, "state": hv * dk * dv * 4,
            "conv_dim": 2 * hk * dk + hv * dv}


def quantized_bytes(bits: int) -> float:
    """Bytes per parameter of an affine-quantized matrix at group size 64 with bf16 scales and biases."""
    return (bits + 32 / 64) / 8


def paper_step(dims: dict, depth: int, target_bits: int = 4, head_bits: int = 6) -> dict:
    """One row's speculative step on Metal at a dense Qwen3.5 hybrid's dimensions, on paper: bytes moved (weights,
    gated-delta state) and the recurrence's kernel launches, before and after it ran once a step. A verify reads
    the body and LM head once, each of the `depth` head forwards its layer, `fc` and the LM head; a gated-delta
    launch (three kernels) reads and writes its fp32 state. Before: a launch per position and a commit copying the
    kept state; after: one launch, and one more over the kept positions where drafts were rejected."""
    sizes = hybrid_sizes(dims)
    linear, attention, state, conv_dim = sizes["linear"], sizes["attention"], sizes["state"], sizes["conv_dim"]
    h, mlp, vocab = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    hv, dv = dims["linear_num_value_heads"], dims["linear_value_head_dim"]
    heads, kv_heads, head_dim = dims["num_attention_heads"], dims["num_key_value_heads"], dims["head_dim"]
    attn = h * (2 * heads * head_dim) + 2 * h * kv_heads * head_dim + heads * head_dim * h  # q and its gate, k, v, o
    gated = h * conv_dim + h * hv * dv + 2 * h * hv + hv * dv * h  # qkv, z, b and a, out
    body = dims["num_hidden_layers"] * 3 * h * mlp + attention * attn + linear * gated
    lm_head = vocab * h
    head_layer = dims.get("mtp_num_hidden_layers", 1) * (attn + 3 * h * mlp) + 2 * h * h  # its layers and fc
    positions = depth + 1
    target = (body + lm_head) * quantized_bytes(target_bits)
    head = depth * (head_layer * quantized_bytes(head_bits) + lm_head * quantized_bytes(target_bits))
    before = {"state_bytes": linear * (positions * 2 * state + 2 * state), "launches": linear * (3 * positions + 2)}
    plain = {"state_bytes": linear * 2 * state, "launches": linear * (3 + 1)}  # and a step whose drafts all held
    return {"target_bytes": target, "head_bytes": head, "plain": plain, "before": before, "after_all_kept": plain,
            "after_rejected": {"state_bytes": linear * 4 * state, "launches": linear * (3 + 3 + 1)}}


def paper_lines(model: str, depth: int) -> str:
    p = paper_step(MODEL_DIMS[model], depth)
    gb = 1e9
    plain = p["target_bytes"] + p["plain"]["state_bytes"]
    out = [f"{model}, depth {depth}, one row: a plain step reads {plain / gb:.2f} GB; the head's {depth} forwards "
           f"{p['head_bytes'] / gb:.2f} GB"]
    for name in ("plain", "before", "after_all_kept", "after_rejected"):
        d = p[name]
        step = p["target_bytes"] + (p["head_bytes"] if name != "plain" else 0) + d["state_bytes"]
        out.append(f"  {name:<15} gated-delta state {d['state_bytes'] / 2**20:8.0f} MiB, {d['launches']:4d} launches; "
                   f"step {step / gb:.2f} GB, {step / plain:.3f} plain steps")
    return "\n".join(out)


#: `--memory`'s tiny target: small everywhere except the linear-attention state.
WIDE = dict(hidden_size=64, num_hidden_layers=8, intermediate_size=128, full_attention_interval=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=8,
            linear_num_value_heads=16, linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4)
MEMORY_PROMPTS = ["def main():", "import os\n", "The quick brown fox", "x = 1\n"]


def predicted_bytes(text: dict, depth: int = 1, replayed: bool = False) -> dict[str, float]:
    """Bytes a row keeps per drafted position at `depth`: the fp32 recurrent state after the position, or
    (`replayed`) the recurrence's inputs and one replayed state a row (1/depth of it); the conv window's input
    and the attention KV (bf16) either way."""
    h = hybrid_sizes(text)
    state = h["linear"] * h["state"] / (depth if replayed else 1)
    conv = h["linear"] * h["conv_dim"] * 2
    inputs = h["linear"] * (h["conv_dim"] + 2 * text["linear_num_value_heads"]) * 2 if replayed else 0
    kv = h["attention"] * 2 * text["num_key_value_heads"] * text["head_dim"] * 2
    return {"state": state, "conv": conv, "inputs": inputs, "kv": kv, "total": state + conv + inputs + kv}


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def step_peaks(engine, width: int, depth: int, repeats: int) -> list[int]:
    """Peak bytes in use during each of `repeats` steps: absolute, since what a step leaves lazy (a commit is
    evaluated by the next step) is part of what speculation costs."""
    import mlx.core as mx

    sched = decode_rows(engine, width, depth, MEMORY_PROMPTS)
    peaks = []
    for _ in range(repeats):
        mx.synchronize()
        mx.reset_peak_memory()
        sched.step()
        mx.synchronize()
        peaks.append(mx.get_peak_memory())
    return peaks


def measure_memory(depths: list[int], widths: list[int], repeats: int, replayed: bool = False) -> dict:
    import mlx.core as mx

    from devkit.demo.modeldir import (build_head, build_qwen3_5, head_config, qwen3_5_config, qwen3_5_text_config,
                                      save_head_dir, save_model_dir)
    from mtpstack.worker.loading import Engine

    with tempfile.TemporaryDirectory() as tmp:
        mx.random.seed(0)
        config = qwen3_5_config(qwen3_5_text_config(**WIDE))
        hconfig = head_config(config["text_config"])
        target = save_model_dir(build_qwen3_5(config), config, Path(tmp) / "target")
        head = save_head_dir(build_head(hconfig), hconfig, Path(tmp) / "mtp")
        engine = Engine.load(str(target), str(head), draft_depth=max(depths))
        rows = []
        for width in widths:
            base = summarize(step_peaks(engine, width, 0, repeats)).median
            for depth in depths:
                predicted = predicted_bytes(engine.target.config["text_config"], depth, replayed)["total"]
                s = summarize([(p - base) / (width * depth) for p in step_peaks(engine, width, depth, repeats)])
                rows.append({"width": width, "depth": depth, "median": s.median, "min": s.min, "max": s.max,
                             "predicted": predicted, "ratio": s.median / predicted})
    return {"dims": WIDE, "repeats": repeats, "replayed": replayed, "rows": rows}


def memory_table(report: dict) -> list[str]:
    lines = [f"{'width':>5} {'depth':>5} {'measured median':>16} {'min-max':>24} {'predicted':>12} {'ratio':>6}"]
    for r in report["rows"]:
        lines.append(f"{r['width']:>5} {r['depth']:>5} {mib(r['median']):>16} {mib(r['min']) + ' - ' + mib(r['max']):>24} "
                     f"{mib(r['predicted']):>12} {r['ratio']:>6.2f}")
    return lines


def memory_lines(model: str, depths: list[int]) -> list[str]:
    dims = MODEL_DIMS[model]
    kept = predicted_bytes(dims)
    lines = [f"{model}, every position's state kept: {mib(kept['total'])} per row per drafted position "
             f"(recurrent state {mib(kept['state'])}, conv window {mib(kept['conv'])}, attention KV {mib(kept['kv'])})"]
    for depth in depths:
        b = predicted_bytes(dims, depth, replayed=True)
        lines.append(f"{model}, replayed, depth {depth}: {mib(b['total'])} per row per drafted position (one "
                     f"replayed state {mib(b['state'] * depth)} a row, conv window {mib(b['conv'])}, the recurrence's "
                     f"inputs {mib(b['inputs'])}, attention KV {mib(b['kv'])} a position)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from devkit.demo.tiny_families import PAIRS

    p.add_argument("--pairs", nargs="+", default=["demo", "qwen3_5"], choices=["demo", *PAIRS],
                   help="demo (the demo pair, target widened) or a family's tiny pair (target MLPs widened)")
    p.add_argument("--depths", type=int, nargs="+",
                   help="drafted depths (the plain step, 0, always runs; default: 1 2 3 4, with --memory 1 2 4)")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 4])
    p.add_argument("--repeats", type=int, help="rounds, every configuration once a round (default: 4); with --memory, "
                   "steps measured per configuration (default: 7)")
    p.add_argument("--steps", type=int, default=4, help="steps timed per configuration per round, unforced and forced each")
    p.add_argument("--mlp-multiplier", type=int, default=8)
    p.add_argument("--extra-layers", type=int, default=10, help="the demo target's zero layers appended (default: 10)")
    p.add_argument("--out", help="write the JSON report here (default: stdout)")
    p.add_argument("--merge", nargs="+", metavar="REPORT", help="print these reports' rounds as one (no measuring)")
    p.add_argument("--memory", action="store_true", help="measure speculation's memory per drafted position instead")
    p.add_argument("--replayed", action="store_true", help="with --memory: gated-delta as on Metal")
    p.add_argument("--model-dims", choices=list(MODEL_DIMS), help="print the figures on paper at these dims")
    args = p.parse_args(argv)
    if args.merge and args.memory:
        p.error("--merge merges step profiles; a --memory report is one run")
    args.depths = args.depths or ([1, 2, 4] if args.memory else [1, 2, 3, 4])
    args.repeats = args.repeats or (7 if args.memory else 4)
    if args.model_dims:
        if not args.memory and "hidden_size" not in MODEL_DIMS[args.model_dims]:
            p.error(f"`{args.model_dims}` has no dimensions for a step on paper: give --memory for its bytes kept")
        print("\n".join(memory_lines(args.model_dims, args.depths) if args.memory
                        else [paper_lines(args.model_dims, depth) for depth in args.depths]))
        return 0
    if args.merge:
        report = merge([json.loads(Path(f).read_text()) for f in args.merge])
    elif args.memory:
        if args.replayed:
            import mtpstack.worker.caches as caches

            caches._runs_kernel = lambda k: True
        report = measure_memory(args.depths, args.widths, args.repeats, args.replayed)
    else:
        ensure_preload()
        report = measure(args)
    render = memory_table if args.memory else table
    return emit(report, render(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
