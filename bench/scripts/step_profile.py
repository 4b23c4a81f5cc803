"""Where one speculative decode step's time goes: part by part, at each depth and width, on two hybrid pairs.

    LD_PRELOAD=.../libblas.so.3 .venv/bin/python bench/scripts/step_profile.py \\
        [--pairs demo qwen3_5] [--depths 0 1 2 3 4] [--widths 1 4] [--repeats 4] [--steps 4] [--out FILE]
    LD_PRELOAD=.../libblas.so.3 .venv/bin/python bench/scripts/step_profile.py --memory \\
        [--depths 1 2 4] [--repeats 7] [--replayed]

The pairs are the worker bench's (`mtpstack.bench.parts.prepare_models`): `demo`, the demo pair with its target
widened to ~70M parameters, and `qwen3_5`, the tiny random Qwen3.5 hybrid of `devkit.demo.tiny_hybrid`
with its target's MLPs widened x8 (a small pair, where per-step overhead dominates); any other bench
family (`nemotron_h`, ...) may be named too. Each configuration (pair, width, depth; depth 0 is the plain
step, no drafts) decodes `width` rows greedily in-process, in the worker's own batch (`Scheduler`, as
served). Every round rebuilds each configuration's rows from the same prompts (so every round times the
same contexts) and warms them up; then, in sweeps where every configuration runs one step (in an order
rotated every sweep, so a burst of load on this shared machine hits each alike):

- `--steps` sweeps as served: the unforced step time (mlx evaluates lazily; only the step's own
  evaluation points synchronise), and beside each step the floor: the target's forward alone over the
  same number of positions with mlx-lm's own caches (no rollback, no head, no sampling);
- `--steps` sweeps in profiling mode, where evaluation is forced at every part's boundary and each
  part's time is split into graph building (Python) and evaluation (compute):

  | part | what |
  |---|---|
  | draft | the drafter's proposals (a head: its forwards and the target's LM head on each) |
  | verify | the target's forward over the step's 1 + k positions, less the recurrence |
  | recurrence | the gated-delta / Mamba2 recurrence inside that forward, keeping what rollback needs |
  | lm head | the target's LM head over the 1 + k positions |
  | sample+accept | sampling every row, reading the tokens back, the acceptance walk |
  | commit | each row's kept recurrent state and conv window |
  | head replay | the head's accept step (rollback, replay forward over the accepted tail, next seed) |
  | other | the rest: the step's inputs, emitting text, the scheduler's bookkeeping |

Forcing evaluation changes the total (parts no longer overlap, every boundary synchronises), so the
forced total is printed beside the unforced one. A configuration's step cost is its median unforced
step over the plain step's (depth 0, same pair and width) in the same round; the same ratio in the
process's CPU time (all its threads; steadier than wall time when other jobs share the cores, though it
counts BLAS threads spinning too); and its floor, the forward alone over 1 + k positions over the forward
over one, same round; each summarised over rounds (median, min-max). A benchmark, not a test.

`--memory`: speculation's extra memory per row per drafted position instead, against what the state sizes
predict (`predicted_bytes`). A verify step of a hybrid target keeps, beyond a plain step, what sets each
row's gated-delta state after its kept positions (`mtpstack.worker.caches.StepRecord`), in one of two ways:
- where mlx-lm's recurrence is a loop of one op a position (the CPU), the state after every position:
  `linear layers x value heads x key dim x value dim x 4` bytes (fp32) per row per drafted position;
- where it is one Metal kernel over all positions (`--replayed` runs that way here, through mlx-lm's
  ops), only the recurrence's inputs (q, k, v: `conv_dim` values, and two gates per value head) per
  drafted position, and at commit one replayed state per row that rejected drafts, whatever the depth
  (1/k of one per drafted position);
plus, either way, a conv window's input (`conv_dim` values) and the attention layers' KV, both small. It
builds a tiny Qwen3.5-family target widened where that state lives (`WIDE`), runs real decode steps at each
width and depth, and reports the peak memory in use during one step (mlx's peak counter, reset before each
step) above the depth-0 step's, per row per drafted position, next to the prediction: median and min-max
over `--repeats` steps.

`--model-dims MODEL`: the figures at a real model's dimensions worked out on paper, and exit: one row's step
on Metal (`paper_step`), or with `--memory` the bytes it keeps (`predicted_bytes`).
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import json
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

from mtpstack.bench.parts import (MODEL_DIMS, PROMPTS, command_line, emit, ensure_preload, loadavg, prepare_models,
                                  rounds)
from mtpstack.bench.stats import summarize

#: The parts of a step, in the order they run (`other` is what the timed parts leave of the forced total).
PARTS = ("draft", "verify", "recurrence", "lm head", "sample+accept", "commit", "head replay", "other")
#: Recurrences the worker calls inside a recurrent layer's forward, by the name its modules import them as
#: (`_states_ops`: the worker's loop of mlx-lm's one-position op that keeps every position's state, the CPU's way).
RECURRENCES = ("gated_delta_update", "_states_ops", "ssm_update")
#: Steps run and discarded after a configuration's rows are rebuilt.
WARMUP_STEPS = 2
#: A row's figures, each kept over rounds (`<name>_raw`) beside its spread.
RAW = ("step_ms", "step_cost", "cpu_cost", "floor_cost", "forced_ms")


# -- pure parts (tested through devkit.scripts.load_script) --------------------------------


class Timeline:
    """Forced-evaluation timings of one step's parts, exclusive of the parts nested in them.

    `enter(part)`/`leave(part)` bracket a part; what a nested part takes is taken out of the part
    that contains it, so the parts of a step add up to the time they cover."""

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
        """The innermost part running now, if any."""
        return self._stack[-1][0] if self._stack else None


def step_parts(timeline: Timeline, total: float) -> dict[str, float]:
    """Seconds per part of one forced step of `total` seconds: the timed parts, `sample+accept` (from the
    end of the last LM-head span to the start of the first commit span after it), and `other`, the rest."""
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
    out = []
    for r in rounds:
        if depth in r and 0 in r and r[0]:
            out.append(summarize(r[depth]).median / summarize(r[0]).median)
    return out


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return "n/a"
    s = summarize([v * scale for v in values])
    return f"{s.median:.{digits}f} ({s.min:.{digits}f}-{s.max:.{digits}f})"


def table(report: dict) -> list[str]:
    lines = [
        "one decode step, in-process, greedy; ms median (min-max) over rounds; 'forced': evaluation forced at "
        "every part boundary (profiling mode, changes the total), parts as build+eval ms",
    ]
    for pair in report["pairs"]:
        lines.append(f"pair {pair['name']}: {pair['models']}")
        for width_rows in pair["widths"]:
            width = width_rows["width"]
            lines.append(f"  width {width}")
            lines.append(f"    {'depth':>5} {'step (unforced)':>22} {'step cost':>18} {'cpu time':>18} {'floor':>18} {'tokens/step':>11} "
                         f"{'forced':>20}   parts (forced, build+eval ms)")
            for row in width_rows["depths"]:
                parts = "  ".join(
                    f"{p} {row['parts'][p]['build_ms']:.1f}+{row['parts'][p]['eval_ms']:.1f}"
                    for p in PARTS if row["parts"][p]["build_ms"] + row["parts"][p]["eval_ms"] >= 0.05
                )
                lines.append(
                    f"    {row['depth']:>5} {row['step_ms']:>22} {row['step_cost']:>18} {row['cpu_cost']:>18} {row['floor_cost']:>18} "
                    f"{row['tokens_per_step']:>11.2f} "
                    f"{row['forced_ms']:>20}   {parts}"
                )
    lines.append(f"load average before / after: {report['loadavg'][0]} / {report['loadavg'][1]}")
    return lines


# -- measuring -------------------------------------------------------------------------------


def _arrays(x) -> list:
    import mlx.core as mx

    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, (list, tuple)):
        return [a for item in x for a in _arrays(item)]
    if isinstance(x, dict):
        return [a for item in x.values() for a in _arrays(item)]
    return []


class Forcing:
    """Profiling mode on one batch: the parts' callables wrapped to force evaluation at their boundaries.

    Duck-typed on what every version of the worker exposes (the drafter's `draft`/`accept`, the target
    parts' `hidden`/`lm_head`, each cache's `commit`, the recurrences by the names the worker's modules
    import), so the same profile runs against the code before and after a change."""

    def __init__(self, engine, batch):
        self.engine, self.batch = engine, batch
        self.timeline = Timeline()
        self._undo: list = []

    def _timed(self, part: str, fn, *, eval_inputs: bool = False, after=None):
        import mlx.core as mx

        timeline = self.timeline

        def wrapper(*args, **kwargs):
            if eval_inputs and timeline.current():  # what the inputs still owe is the enclosing part's work
                start = timeline.clock()
                mx.eval(_arrays((args, kwargs)))
                timeline.add(timeline.current() + " eval", timeline.clock() - start)
            timeline.enter(part)
            out = fn(*args, **kwargs)
            built = timeline.clock()
            mx.eval(_arrays(out))
            if after is not None:
                after()
            timeline.add(part + " eval", timeline.clock() - built)
            timeline.leave(part)
            return out

        return wrapper

    def _patch(self, owner, name: str, value) -> None:
        had = name in vars(owner) if hasattr(owner, "__dict__") else False
        old = getattr(owner, name)
        self._undo.append((owner, name, old, had))
        setattr(owner, name, value)

    def install(self) -> "Forcing":
        import mlx.core as mx

        parts, drafter = self.engine.parts, self.batch.drafter
        self._patch(parts, "hidden", self._timed("verify", parts.hidden))
        self._patch(parts, "lm_head", self._timed("lm head", parts.lm_head))
        if drafter is not None:
            # What a drafter leaves lazy (its caches, a head's next seed) is forced with the part that made it.
            def drafter_state():
                mx.eval([c.state for c in drafter.caches], drafter.arrays(self.batch.rows))

            self._patch(drafter, "draft", self._timed("draft", drafter.draft, after=drafter_state))
            self._patch(drafter, "accept", self._timed("head replay", drafter.accept, after=drafter_state))
        caches = self.batch.caches
        for i, cache in enumerate(caches):
            last = i == len(caches) - 1
            self._patch(cache, "commit", self._timed(
                "commit", cache.commit, after=(lambda: mx.eval([c.state for c in caches])) if last else None))
        for module in [m for name, m in list(sys.modules.items()) if name.startswith("mtpstack.worker") and m is not None]:
            for name in RECURRENCES:
                if callable(getattr(module, name, None)):
                    self._patch(module, name, self._timed("recurrence", getattr(module, name), eval_inputs=True))
        from mlx_lm.models import ssm

        self._patch(ssm, "ssm_update", self._timed("recurrence", ssm.ssm_update, eval_inputs=True))
        return self

    def remove(self) -> None:
        for owner, name, old, had in reversed(self._undo):
            if had or not hasattr(owner, "__dict__"):
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        self._undo = []


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


class Floor:
    """The target's forward alone (mlx-lm's own caches, no rollback, no head, no sampling) over `positions`
    new tokens per row: the least a verify step of that many positions can cost. Each call starts from the
    same prefilled context (the caches are put back after it)."""

    def __init__(self, engine, width: int, positions: int):
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        self.parts = engine.parts
        self.cache = make_prompt_cache(engine.target.model)
        context = engine.text_prompt(" ".join(PROMPTS))[:32]
        mx.eval(self.parts.hidden(mx.array([context] * width), self.cache))
        self.saved = [list(c.cache) if hasattr(c, "cache") else None for c in self.cache]
        mx.eval([c.state for c in self.cache])
        self.tokens = mx.array([[5] * positions] * width, dtype=mx.uint32)
        self.positions = positions

    def step(self) -> float:
        import mlx.core as mx

        start = time.perf_counter()
        mx.eval(self.parts.lm_head(self.parts.hidden(self.tokens, self.cache)))
        elapsed = time.perf_counter() - start
        for c, saved in zip(self.cache, self.saved):
            if saved is None:
                c.trim(self.positions)
            else:
                c.cache = list(saved)
        return elapsed


def measure_round(engines: dict, configs: list, steps: int, rnd: int) -> dict:
    """One round: every configuration's rows rebuilt, then `steps` sweeps of one unforced step each (the
    configurations in an order rotated every sweep, so a burst of load hits each alike), then `steps` sweeps of
    forced steps; and the forward-only floor, interleaved the same way."""
    import mlx.core as mx

    scheds = {c: decode_rows(engines[c[0]], c[1], c[2]) for c in configs}
    floors = {c: Floor(engines[c[0]], c[1], 1 + c[2]) for c in configs}
    out = {c: {"unforced": [], "cpu": [], "forced": [], "parts": [], "floor": [], "tokens": 0} for c in configs}

    def order(sweep: int) -> list:
        shift = (rnd * steps + sweep) % len(configs)
        return configs[shift:] + configs[:shift]

    for sweep in range(steps):
        for c in order(sweep):
            start, cpu = time.perf_counter(), time.process_time()
            results = scheds[c].step()
            out[c]["unforced"].append(time.perf_counter() - start)
            out[c]["cpu"].append(time.process_time() - cpu)
            out[c]["tokens"] += sum(r.tokens for _, r, _ in results if r is not None)
            out[c]["floor"].append(floors[c].step())
    for c in configs:
        mx.eval([cache.state for cache in scheds[c].batch.caches])  # nothing lazy carried into the forced steps
    for sweep in range(steps):
        for c in order(sweep):
            sched = scheds[c]
            forcing = Forcing(engines[c[0]], sched.batch).install()
            try:
                start = time.perf_counter()
                sched.step()
                total = time.perf_counter() - start
            finally:
                forcing.remove()
            out[c]["forced"].append(total)
            timeline = forcing.timeline
            exclusive = step_parts(timeline, total)
            evals = {p: timeline.totals.get(p + " eval", 0.0) for p in PARTS}
            out[c]["parts"].append({p: {"build": exclusive[p] - evals[p], "eval": evals[p]} for p in PARTS})
    for c in configs:
        out[c]["tokens_per_step"] = out[c].pop("tokens") / (steps * c[1])
    return out


def measure(args) -> dict:
    from mtpstack.worker.loading import Engine

    started = loadavg()
    depths = sorted(set(args.depths) | {0})
    with tempfile.TemporaryDirectory(prefix="step-profile-") as tmp:
        engines, sources = {}, {}
        for name in args.pairs:
            bench_args = Namespace(target=None, drafter=None, family=None if name == "demo" else name,
                                   mlp_multiplier=args.mlp_multiplier, extra_layers=args.extra_layers)
            target, head, sources[name] = prepare_models(bench_args, Path(tmp) / name)
            engines[name] = Engine.load(str(target), str(head), draft_depth=max(depths))
        configs = [(p, w, d) for p in args.pairs for w in args.widths for d in depths]
        runs = [measure_round(engines, configs, args.steps, rnd) for rnd, _ in rounds(0, args.repeats)]
    pairs = [{"name": name, "models": sources[name], "widths": [
        {"width": width, "depths": [depth_row(runs, (name, width), d) for d in depths]} for width in args.widths]}
        for name in args.pairs]
    return {"command": command_line(), "repeats": args.repeats, "steps": args.steps, "loadavg": [started, loadavg()],
            "pairs": pairs}


def depth_row(rounds: list[dict], pair_width: tuple, depth: int) -> dict:
    """One depth's row of a pair and width: its steps' medians over rounds, its costs paired by round."""
    runs = [r[(*pair_width, depth)] for r in rounds]

    def cost(key: str) -> list[float]:
        per_round = [{d: v[key] for (*pw, d), v in r.items() if tuple(pw) == pair_width} for r in rounds]
        return step_cost_rounds(per_round, depth)

    def medians(key: str) -> list[float]:
        return [summarize(run[key]).median for run in runs]

    raw = {"step_ms": medians("unforced"), "step_cost": cost("unforced"), "cpu_cost": cost("cpu"),
           "floor_cost": cost("floor"), "forced_ms": medians("forced")}
    parts = {p: {k + "_ms": summarize([summarize([s[p][k] for s in run["parts"]]).median for run in runs]).median * 1e3
                 for k in ("build", "eval")} for p in PARTS}
    return row_of(depth, raw, parts, summarize([run["tokens_per_step"] for run in runs]).median)


def row_of(depth: int, raw: dict[str, list[float]], parts: dict, tokens_per_step: float) -> dict:
    """A depth's row of the report: each figure's values over rounds (`_raw`) and their spread."""
    row = {"depth": depth, "parts": parts, "tokens_per_step": tokens_per_step}
    for key in RAW:
        row[key + "_raw"] = raw[key]
        row[key] = spread(raw[key], 1e3 if key.endswith("_ms") else 1.0)
    return row


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
    """One row's speculative step on Metal at a dense Qwen3.5 hybrid's dimensions, worked out on paper: the
    bytes it reads and writes (weights, and the gated-delta state traffic), and the kernel launches of the
    gated-delta recurrence, before and after the recurrence ran once per step.

    Weights: the target's body and LM head once per verify forward; each of the head's `depth` forwards reads
    its layer, its `fc` and the target's LM head. State: each launch of mlx-lm's gated-delta kernel reads the
    state it starts from and writes the one it ends with (value heads x key dim x value dim, fp32). Before:
    one launch per position, each with its state, and a commit copying the kept one; after: one launch, and a
    second from the step's start over the kept positions only for a row that rejected drafts. A launch of the
    recurrence is three kernels (the decay, the gate, the recurrence); the commit's conv window one more, and
    before, the copy of the kept state one more."""
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
    after_kept = {"state_bytes": linear * 2 * state, "launches": linear * (3 + 1)}
    after_rejected = {"state_bytes": linear * 4 * state, "launches": linear * (3 + 3 + 1)}
    plain = {"state_bytes": linear * 2 * state, "launches": linear * (3 + 1)}
    return {"target_bytes": target, "head_bytes": head, "plain": plain, "before": before,
            "after_all_kept": after_kept, "after_rejected": after_rejected}


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


def merge(reports: list[dict]) -> dict:
    """Reports of the same configurations (e.g. single rounds run alternately with another build's, under one
    lock) as one: every round's values together, the parts' medians over the reports."""
    first = reports[0]
    pairs = []
    for p, pair in enumerate(first["pairs"]):
        widths = []
        for w, width in enumerate(pair["widths"]):
            rows = []
            for d, row in enumerate(width["depths"]):
                same = [r["pairs"][p]["widths"][w]["depths"][d] for r in reports]
                if any(x["depth"] != row["depth"] for x in same):
                    raise ValueError("the reports do not measure the same configurations")
                parts = {part: {k: summarize([x["parts"][part][k] for x in same]).median for k in row["parts"][part]}
                         for part in PARTS}
                raw = {key: [v for x in same for v in x[key + "_raw"]] for key in RAW}
                rows.append(row_of(row["depth"], raw, parts, summarize([x["tokens_per_step"] for x in same]).median))
            widths.append({"width": width["width"], "depths": rows})
        pairs.append({"name": pair["name"], "models": pair["models"], "widths": widths})
    return {"command": first["command"], "repeats": sum(r["repeats"] for r in reports), "steps": first["steps"],
            "loadavg": [r["loadavg"][0] for r in reports][:1] + [r["loadavg"][-1] for r in reports][-1:],
            "merged": len(reports), "pairs": pairs}


# -- --memory: what a drafted position keeps -------------------------------------------------


#: The widened tiny target: small everywhere except the linear-attention state.
WIDE = dict(hidden_size=64, num_hidden_layers=8, intermediate_size=128, full_attention_interval=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=8,
            linear_num_value_heads=16, linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4)
MEMORY_PROMPTS = ["def main():", "import os\n", "The quick brown fox", "x = 1\n"]


def predicted_bytes(text: dict, depth: int = 1, replayed: bool = False) -> dict[str, float]:
    """Bytes one row keeps per drafted position at `depth`: the recurrent state (fp32) after the position,
    or (`replayed`) the recurrence's inputs and one replayed state per row whatever the depth (1/depth of
    it); either way the conv window's input and the attention KV (bf16)."""
    h = hybrid_sizes(text)
    state = h["linear"] * h["state"] / (depth if replayed else 1)
    conv = h["linear"] * h["conv_dim"] * 2
    inputs = h["linear"] * (h["conv_dim"] + 2 * text["linear_num_value_heads"]) * 2 if replayed else 0
    kv = h["attention"] * 2 * text["num_key_value_heads"] * text["head_dim"] * 2
    return {"state": state, "conv": conv, "inputs": inputs, "kv": kv, "total": state + conv + inputs + kv}


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def memory_pair(out: Path) -> tuple[Path, Path]:
    import mlx.core as mx

    from devkit.demo.modeldir import build_head, build_qwen3_5, head_config, qwen3_5_config, qwen3_5_text_config, save_head_dir, save_model_dir

    mx.random.seed(0)
    config = qwen3_5_config(qwen3_5_text_config(**WIDE))
    hconfig = head_config(config["text_config"])
    target = save_model_dir(build_qwen3_5(config), config, out / "target")
    return target, save_head_dir(build_head(hconfig), hconfig, out / "mtp")


def step_peaks(engine, width: int, depth: int, repeats: int) -> list[int]:
    """Peak bytes in use during each of `repeats` decode steps of `width` rows at `depth`."""
    import mlx.core as mx

    sched = decode_rows(engine, width, depth, MEMORY_PROMPTS)
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


def measure_memory(depths: list[int], widths: list[int], repeats: int, replayed: bool = False) -> dict:
    from mtpstack.worker.loading import Engine

    with tempfile.TemporaryDirectory() as tmp:
        target, head = memory_pair(Path(tmp))
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
                   help="demo: the demo pair, target widened; a family (qwen3_5, the tiny hybrid, ...): its tiny pair, "
                   "target MLPs widened")
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
    p.add_argument("--replayed", action="store_true", help="with --memory: run the gated-delta layers as on Metal (one "
                   "call a step, rejected rows replayed at commit) through mlx-lm's ops, and predict that")
    p.add_argument("--model-dims", choices=list(MODEL_DIMS), help="print the figures at a real model's dimensions "
                   "worked out on paper (one row's step on Metal; with --memory, the bytes it keeps) and exit")
    args = p.parse_args(argv)
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
        return emit(report, table(report), args.out)
    if args.memory:
        if args.replayed:
            import mtpstack.worker.caches as caches

            caches._runs_kernel = lambda k: True
        report = measure_memory(args.depths, args.widths, args.repeats, args.replayed)
        return emit(report, memory_table(report), args.out)
    ensure_preload()
    report = measure(args)
    return emit(report, table(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
