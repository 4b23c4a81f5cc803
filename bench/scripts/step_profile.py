"""Where one speculative decode step's time goes: part by part, at each depth and width, on two hybrid pairs.

    LD_PRELOAD=.../libblas.so.3 .venv/bin/python bench/scripts/step_profile.py \\
        [--pairs demo qwen3_5] [--depths 0 1 2 3 4] [--widths 1 4] [--repeats 4] [--steps 4] [--out FILE]

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
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

from mtpstack.bench.parts import MODEL_DIMS, PROMPTS, emit, ensure_preload, prepare_models
from mtpstack.bench.stats import summarize

#: The parts of a step, in the order they run (`other` is what the timed parts leave of the forced total).
PARTS = ("draft", "verify", "recurrence", "lm head", "sample+accept", "commit", "head replay", "other")
#: Recurrences the worker calls inside a recurrent layer's forward, by the name its modules import them as
#: (`_states_ops`: the worker's loop of mlx-lm's one-position op that keeps every position's state, the CPU's way).
RECURRENCES = ("gated_delta_update", "_states_ops", "ssm_update")
#: Steps run and discarded after a configuration's rows are rebuilt.
WARMUP_STEPS = 2


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


def build_rows(engine, width: int, depth: int):
    """`width` rows of the worker's batch decoding at `depth`, prompts in, warmed up."""
    from mtpstack.worker.scheduler import Scheduler
    from mtpstack.worker.sequence import SamplingParams

    sched = Scheduler(max_num_seqs=width)
    for i in range(width):
        sched.add(engine.new_sequence(engine.text_prompt(PROMPTS[i % len(PROMPTS)]),
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

    scheds = {c: build_rows(engines[c[0]], c[1], c[2]) for c in configs}
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

    loads = [_loadavg()]
    pairs = []
    depths = sorted(set(args.depths) | {0})
    with tempfile.TemporaryDirectory(prefix="step-profile-") as tmp:
        engines, sources = {}, {}
        for name in args.pairs:
            bench_args = Namespace(target=None, drafter=None, family=None if name == "demo" else name,
                                   mlp_multiplier=args.mlp_multiplier, extra_layers=args.extra_layers)
            target, head, sources[name] = prepare_models(bench_args, Path(tmp) / name)
            engines[name] = Engine.load(str(target), str(head), draft_depth=max(depths))
        configs = [(p, w, d) for p in args.pairs for w in args.widths for d in depths]
        rounds = []
        for rnd in range(args.repeats):
            rounds.append(measure_round(engines, configs, args.steps, rnd))
            print(f"round {rnd + 1}/{args.repeats} done", file=sys.stderr)
        for name in args.pairs:
            widths = []
            for width in args.widths:
                per_round = [{d: r[(name, width, d)]["unforced"] for d in depths} for r in rounds]
                cpu_rounds = [{d: r[(name, width, d)]["cpu"] for d in depths} for r in rounds]
                floor_rounds = [{d: r[(name, width, d)]["floor"] for d in depths} for r in rounds]
                rows = []
                for d in depths:
                    runs = [r[(name, width, d)] for r in rounds]
                    unforced = [summarize(run["unforced"]).median for run in runs]
                    forced = [summarize(run["forced"]).median for run in runs]
                    parts = {p: {k + "_ms": summarize([summarize([s[p][k] for s in run["parts"]]).median for run in runs]).median * 1e3
                                 for k in ("build", "eval")} for p in PARTS}
                    cost, floor = step_cost_rounds(per_round, d), step_cost_rounds(floor_rounds, d)
                    cpu_cost = step_cost_rounds(cpu_rounds, d)
                    rows.append({"depth": d, "step_ms": spread(unforced, 1e3), "step_ms_raw": unforced,
                                 "step_cost": spread(cost), "step_cost_raw": cost,
                                 "cpu_cost": spread(cpu_cost), "cpu_cost_raw": cpu_cost,
                                 "floor_cost": spread(floor), "floor_cost_raw": floor,
                                 "forced_ms": spread(forced, 1e3), "forced_ms_raw": forced, "parts": parts,
                                 "tokens_per_step": summarize([run["tokens_per_step"] for run in runs]).median})
                widths.append({"width": width, "depths": rows})
            pairs.append({"name": name, "models": sources[name], "widths": widths})
    loads.append(_loadavg())
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]), "repeats": args.repeats, "steps": args.steps,
            "loadavg": loads, "pairs": pairs}


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
    layers, interval = dims["num_hidden_layers"], dims["full_attention_interval"]
    linear = layers - layers // interval
    attention = layers - linear
    h, mlp, vocab = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    hv, hk, dk, dv = (dims[k] for k in ("linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
                                         "linear_value_head_dim"))
    heads, kv_heads, head_dim = dims["num_attention_heads"], dims["num_key_value_heads"], dims["head_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    attn = h * (2 * heads * head_dim) + 2 * h * kv_heads * head_dim + heads * head_dim * h  # q and its gate, k, v, o
    gated = h * conv_dim + h * hv * dv + 2 * h * hv + hv * dv * h  # qkv, z, b and a, out
    body = layers * 3 * h * mlp + attention * attn + linear * gated
    lm_head = vocab * h
    head_layer = dims.get("mtp_num_hidden_layers", 1) * (attn + 3 * h * mlp) + 2 * h * h  # its layers and fc
    positions = depth + 1
    state = hv * dk * dv * 4
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
                out = {"depth": row["depth"]}
                for key in ("step_ms", "step_cost", "cpu_cost", "floor_cost", "forced_ms"):
                    values = [v for x in same for v in x[key + "_raw"]]
                    out[key + "_raw"] = values
                    out[key] = spread(values, 1e3 if key.endswith("_ms") else 1.0)
                out["parts"] = {part: {k: summarize([x["parts"][part][k] for x in same]).median for k in row["parts"][part]}
                                for part in PARTS}
                out["tokens_per_step"] = summarize([x["tokens_per_step"] for x in same]).median
                rows.append(out)
            widths.append({"width": width["width"], "depths": rows})
        pairs.append({"name": pair["name"], "models": pair["models"], "widths": widths})
    return {"command": first["command"], "repeats": sum(r["repeats"] for r in reports), "steps": first["steps"],
            "loadavg": [r["loadavg"][0] for r in reports][:1] + [r["loadavg"][-1] for r in reports][-1:],
            "merged": len(reports), "pairs": pairs}


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from devkit.demo.tiny_families import PAIRS

    p.add_argument("--pairs", nargs="+", default=["demo", "qwen3_5"], choices=["demo", *PAIRS],
                   help="demo: the demo pair, target widened; a family (qwen3_5, the tiny hybrid, ...): its tiny pair, "
                   "target MLPs widened")
    p.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4], help="drafted depths (the plain step, 0, always runs)")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 4])
    p.add_argument("--repeats", type=int, default=4, help="rounds, every configuration once a round (default: 4)")
    p.add_argument("--steps", type=int, default=4, help="steps timed per configuration per round, unforced and forced each")
    p.add_argument("--mlp-multiplier", type=int, default=8)
    p.add_argument("--extra-layers", type=int, default=10, help="the demo target's zero layers appended (default: 10)")
    p.add_argument("--out", help="write the JSON report here (default: stdout)")
    p.add_argument("--merge", nargs="+", metavar="REPORT", help="print these reports' rounds as one (no measuring)")
    p.add_argument("--model-dims", choices=[m for m, dims in MODEL_DIMS.items() if "hidden_size" in dims], help="print one row's step on Metal at a real model's "
                   "dimensions, worked out on paper (`paper_step`), and exit")
    args = p.parse_args(argv)
    if args.model_dims:
        for depth in args.depths:
            print(paper_lines(args.model_dims, depth))
        return 0
    if args.merge:
        import json

        report = merge([json.loads(Path(f).read_text()) for f in args.merge])
        return emit(report, table(report), args.out)
    ensure_preload()
    report = measure(args)
    return emit(report, table(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
