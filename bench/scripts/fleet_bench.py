"""Fleet benchmark: the whole stack against the stacks people build instead, on an agent workload;
and, `--routing`, the proxy's `affinity` routing against `first-free` on agent conversations.

Each stack is started fresh per round, in rotating order: `mtpstack` (the proxy before two native workers with
the MTP head), `litellm` (LiteLLM's proxy, `least-busy`) and `nginx` (round-robin), both before two
`mlx_lm.server`. The JSON (rows and summaries) and the plot go to `--out`, the table to stderr. The method
and the figures: docs/bench.md, and docs/proxy.md's benchmark of routing.

    python bench/scripts/fleet_bench.py --out bench/out/fleet        # 3 rounds, the widened target
    python bench/scripts/fleet_bench.py --quick                        # a few minutes: small and short
    python bench/scripts/fleet_bench.py --url http://HOST:PORT/v1 --model NAME   # replay against any server
    python bench/scripts/fleet_bench.py --routing --out /tmp/routing-bench   # 3 rounds, the widened target
    python bench/scripts/fleet_bench.py --routing --quick                     # not widened, 12 tools, 3 turns
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from mtpstack import series
from mtpstack.bench import stats
from mtpstack.bench.conversations import API_KEY, REQUEST_TIMEOUT, answered, one_turn, run_sessions
from mtpstack.bench.parts import demo_pair, emit, ensure_preload, fmt, rotated, run_meta, spread, version_of
from mtpstack.bench.report import figure, save_figure
from mtpstack.bench.servers import metrics, served_model, start_workers, worker_command, worker_profile
from mtpstack.bench.load import request_events
from mtpstack.bench.stacks import cpu_seconds, nginx_program, nginx_version, start_fleet, start_nginx
from mtpstack.bench.workloads import (ANSWER_TOKENS, CONTEXT, TOOLS, TURNS, calibrate, conversation, first_question,
                                      make_workload, system_prompt)
from mtpstack.proxy.prometheus import sample
from mtpstack.runtime import Process, Processes, free_port, url_of

ROOT = _checkout.ROOT
STACKS = ("mtpstack", "litellm", "nginx")
BASE_STACK = "mtpstack"
#: `--stacks` beyond the three: mtpstack with `--affinity-wait`, and with `first-free` routing (`--routing`'s).
EXTRA_STACKS = ("mtpstack-wait", "mtpstack-first-free")
POLICIES = {"mtpstack": "affinity", "mtpstack-first-free": "first-free"}
#: Two backends per stack of this batch width each: each of `--routing`'s four conversations has a slot.
BACKENDS = 2
WIDTH = 2
#: The sizes of a full run and of `--quick`. Token counts are the served model's (the demo tokenizer).
FULL = {"sessions": 6, "turns": (4, 6), "output_tokens": (200, 2000), "answer_tokens": 48, "arrival_s": 5.0,
        "think_s": (1.0, 4.0), "rounds": 3, "mlp_multiplier": 2, "extra_layers": 2}
QUICK = {"sessions": 3, "turns": (2, 3), "output_tokens": (200, 600), "answer_tokens": 16, "arrival_s": 1.0,
         "think_s": (0.5, 1.0), "rounds": 1, "mlp_multiplier": 1, "extra_layers": 0}
#: `--routing`'s: four conversations of the agent bench, and of `--quick`.
ROUTING = {"sessions": 4, "tools": 40, "turns": (TURNS, TURNS), "answer_tokens": ANSWER_TOKENS, "rounds": 3,
           "pause": 2.0, "output_lines": 0, "mlp_multiplier": 8, "extra_layers": 10}
ROUTING_QUICK = {**ROUTING, "tools": 12, "turns": (3, 3), "answer_tokens": 8, "rounds": 1, "mlp_multiplier": 1,
                 "extra_layers": 0}
#: The body's extra fields: thinking off, so every stack renders the same prompt (`mlx_lm.server` turns it on
#: unless told); the routing conversations run every answer to `max_tokens`, as agent_bench's.
EXTRA = {"sessions": {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
         "routing": {"ignore_eos": True}}


# -- summaries (pure) ---------------------------------------------------------------------------

#: Per-round figures: name -> (what, True when higher is better, the table's header, digits, scale).
METRICS = {
    "ttft_p50": ("turn TTFT p50", False, "TTFT p50 s", 2, 1),
    "ttft_p95": ("turn TTFT p95", False, "TTFT p95 s", 2, 1),
    "turn_p50": ("turn time p50", False, "turn p50 s", 2, 1),
    "turn_p95": ("turn time p95", False, "turn p95 s", 2, 1),
    "tok_s": ("output tok/s", True, "out tok/s", 1, 1),
    "cached_share": ("prompt tokens from a cache", True, "cached", 0, 100),
}
#: The statuses of `conversations.STATUSES` that are failures -> the table's header.
FAILURES = {"error": "err", "429": "429", "timeout": "t/o"}
#: The latency percentiles: the figure's name -> (the row's field, the percentile).
PERCENTILES = {f"{name}_p{q}": (key, q) for name, key in (("ttft", "ttft_s"), ("turn", "total_s")) for q in (50, 95)}


def round_metrics(rows: list[dict]) -> dict:
    """One run's figures from its turns: latencies over the answered turns, throughput over the span from
    the first request to the last answer, the counts of each failure."""
    ok = [r for r in rows if r["status"] == "ok"]
    out: dict = {"tok_s": None, "cached_share": None, "turns": len(rows),
                 **{status: sum(r["status"] == status for r in rows) for status in FAILURES}}
    for name, (key, q) in PERCENTILES.items():
        values = [r[key] for r in ok if r.get(key) is not None]
        out[name] = stats.percentile(values, q) if values else None
    if rows:
        span = max(r["sent_s"] + r["total_s"] for r in rows) - min(r["sent_s"] for r in rows)
        tokens = sum(r.get("completion_tokens") or 0 for r in ok)
        out["tok_s"] = tokens / span if span > 0 else None
    reported = [r for r in ok if r.get("prompt_tokens") and r.get("cached_tokens") is not None]
    if reported:
        out["cached_share"] = sum(r["cached_tokens"] for r in reported) / sum(r["prompt_tokens"] for r in reported)
    return out


def grouped(rows: list[dict], *fields: str, value: str | None = None) -> dict:
    """`rows` by their `fields` (one field: its value; several: a tuple), in first-seen order; `value`: each
    answered row's value of that field, where known."""
    out: dict = {}
    for r in rows:
        if value is None or (r["status"] == "ok" and r.get(value) is not None):
            key = tuple(r[f] for f in fields) if len(fields) > 1 else r[fields[0]]
            out.setdefault(key, []).append(r if value is None else r[value])
    return out


def measured(values: list) -> dict | None:
    """`parts.spread` of the values measured (not None); None when there are none."""
    s = spread([x for x in values if x is not None])
    return s if s["n"] else None


def per_round(rows: list[dict]) -> list[dict]:
    """`round_metrics` of each round of `rows` (one stack's)."""
    return [round_metrics(group) for _, group in sorted(grouped(rows, "round").items())]


def summarize_stacks(rows: list[dict]) -> dict:
    """Per stack: every figure of `round_metrics` as the median over rounds with min-max."""
    out = {}
    for stack, mine in grouped(rows, "stack").items():
        rounds = per_round(mine)
        out[stack] = {**{k: measured([m[k] for m in rounds]) for k in (*METRICS, *FAILURES)},
                      "turns": sum(m["turns"] for m in rounds), "rounds": len(rounds)}
    return out


def compare(rows: list[dict], base: str = BASE_STACK, resamples: int = 2000) -> dict:
    """Each other stack over `base`, per figure: the ratio and its 95% bootstrap interval. Latency percentiles
    pool the turns and resample whole sessions; throughput resamples per-round values (none under `MIN_PASSES`)."""
    out: dict = {}
    stacks = grouped(rows, "stack")
    base_rows = stacks.get(base, [])
    for stack, mine in stacks.items():
        if stack == base:
            continue
        cell = {}
        for name, (key, q) in PERCENTILES.items():  # one cluster per session of each round
            b, c = (list(grouped(side, "round", "session", value=key).values()) for side in (base_rows, mine))
            if b and c:
                ratio, lo, hi = stats.cluster_ratio_ci(b, c, lambda v, q=q: stats.percentile(v, q), resamples=resamples)
                cell[name] = {"ratio": ratio, "lo": lo, "hi": hi, "n": [len(b), len(c)], "unit": "sessions"}
        tb, tc = ([m["tok_s"] for m in per_round(side) if m["tok_s"]] for side in (base_rows, mine))
        if tb and tc:
            ratio, lo, hi = (stats.ratio_ci(tb, tc, resamples=resamples) if min(len(tb), len(tc)) >= stats.MIN_PASSES
                             else (stats.median(tc) / stats.median(tb), None, None))
            cell["tok_s"] = {"ratio": ratio, "lo": lo, "hi": hi, "n": [len(tb), len(tc)], "unit": "rounds"}
        out[stack] = cell
    return out


def ttft_by_turn(rows: list[dict]) -> dict:
    """Per stack and turn number: median, p95 and count of the answered turns' TTFT (all sessions and rounds)."""
    return {stack: [{"turn": t, "median": stats.median(v), "p95": stats.percentile(v, 95), "n": len(v)}
                    for t, v in sorted(grouped(mine, "turn", value="ttft_s").items())]
            for stack, mine in grouped(rows, "stack").items()}


def _count(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{s['median']:g}" if s["min"] == s["max"] else f"{s['median']:g} ({s['min']:g}-{s['max']:g})"


def format_lines(report: dict) -> list[str]:
    """The table a person reads: a row per stack (median over rounds, min-max), then each stack against
    mtpstack with its interval, then the goal, stated as met or not."""
    m, summary = report["meta"], report["summary"]
    sz = m["sizes"]
    lines = [f"{sz['sessions']} agent sessions x {sz['turns'][0]}-{sz['turns'][1]} turns (tool outputs "
             f"{sz['output_tokens'][0]}-{sz['output_tokens'][1]} tokens, {sz['answer_tokens']} answer tokens at most), "
             f"{m['rounds_run']} round(s), stacks alternated; model: {m.get('models', '?')}",
             f"load average {m.get('loadavg_start', ['?'])[0]} at the start, {m.get('loadavg_end', ['?'])[0]} at the "
             "end; figures: median over rounds (min-max)"]
    cells = [["stack", *(header for _, _, header, _, _ in METRICS.values()), *FAILURES.values()]]
    cells += [[stack, *(fmt(s[key], "%" if scale == 100 else "", digits, scale=scale, count=False, missing="-")
                        for key, (_, _, _, digits, scale) in METRICS.items()), *(_count(s[c]) for c in FAILURES)]
              for stack, s in summary["stacks"].items()]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    table = ["  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))]) for row in cells]
    lines += [table[0], "-" * len(table[0]), *table[1:]]
    for stack, cell in summary["compare"].items():
        lines.append(f"{stack} / {BASE_STACK}: " + "; ".join(
            f"{METRICS[key][0]} {c['ratio']:.2f}x " + ("(too few rounds for an interval)" if c["lo"] is None
                                                       else f"[{c['lo']:.2f}, {c['hi']:.2f}]")
            for key, c in cell.items()))
    return lines + [f"goal: {g}" for g in summary.get("goal", [])] + [f"note: {n}" for n in summary.get("notes", [])]


def goal_lines(summary: dict, base: str = BASE_STACK) -> list[str]:
    """The issue's goal, figure by figure: is `base` best, with zero errors?"""
    stacks = summary["stacks"]
    if base not in stacks or len(stacks) < 2:
        return []
    out = []
    for key in ("ttft_p95", "turn_p95", "tok_s"):
        what, higher = METRICS[key][:2]
        values = {k: v[key]["median"] for k, v in stacks.items() if v.get(key)}
        if base in values:
            best = (max if higher else min)(values, key=values.get)
            out.append(f"{what}: {'met' if best == base else 'not met'}: best is {best} ({values[best]:.3g}), "
                       f"{base} {values[base]:.3g}")
    failed = sum((stacks[base][c] or {}).get("max") or 0 for c in FAILURES)
    return out + [f"zero errors, 429s and timeouts for {base}: {'not met' if failed else 'met'}"]


def plot_ttft_by_turn(by_turn: dict, path: str | Path, title: str) -> Path:
    """TTFT by turn number, one line per stack: the median (solid) and p95 (dashed), log scale."""
    fig, ax = figure(figsize=(7.0, 4.2))
    for i, (stack, points) in enumerate(by_turn.items()):
        if not points:
            continue
        xs = [p["turn"] for p in points]
        ax.plot(xs, [p["median"] for p in points], "o-", color=f"C{i}", label=f"{stack} median")
        ax.plot(xs, [p["p95"] for p in points], "x--", color=f"C{i}", alpha=0.7, label=f"{stack} p95")
    ax.set_yscale("log")
    ax.set_xticks(sorted({p["turn"] for points in by_turn.values() for p in points}))
    ax.set_xlabel("turn of the session")
    ax.set_ylabel("time to first token, s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", ncol=len(by_turn))
    ax.set_title(title, fontsize="medium")
    return save_figure(fig, path)


# -- `--routing`'s summaries (pure) -------------------------------------------------------------


def stayed(rows: list[dict]) -> list[bool]:
    """For each turn 2+ with both ends known: did the worker of the session's previous turn serve it?"""
    sessions = [{r["turn"]: r.get("worker") for r in g} for g in grouped(rows, "stack", "round", "session").values()]
    return [worker == turns[t - 1] for turns in sessions for t, worker in sorted(turns.items())
            if t >= 2 and worker is not None and turns.get(t - 1) is not None]


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def summarize_policy(rows: list[dict], runs: list[dict]) -> dict:
    """One policy's rows and runs: TTFT of turns 2+ (and per round) beside turn 1's, the affinity hits,
    the routing decisions, the cached share of turns 2+'s prompt tokens, the workers' prefix-cache hits."""
    later = [r for r in rows if r["turn"] >= 2]
    kept = stayed(rows)
    decisions = dict(Counter(r["routing"] for r in rows if r.get("routing")))
    cached_later, prompt_later = (sum(r.get(k) or 0 for r in later if r.get("prompt_tokens"))
                                  for k in ("cached_tokens", "prompt_tokens"))
    hits, lookups = (sum(run["workers"][k] for run in runs if run.get("workers"))
                     for k in ("prefix_cache_hits", "prefix_cache_lookups"))
    return {
        "ttft_turn1_s": measured([r["ttft_s"] for r in rows if r["turn"] == 1]),
        "ttft_later_s": measured([r["ttft_s"] for r in later]),
        "ttft_later_per_run_s": [stats.median(v) for _, v in sorted(grouped(later, "round", value="ttft_s").items())],
        "prompt_tokens": measured([r["prompt_tokens"] for r in rows if r.get("prompt_tokens")]),
        "affinity_hit_rate": _share(sum(kept), len(kept)), "affinity_hits": [sum(kept), len(kept)],
        "decisions": decisions,
        "cached_share_later": _share(cached_later, prompt_later), "cached_tokens_later": [cached_later, prompt_later],
        "prefix_cache_hit_rate": _share(hits, lookups), "prefix_cache": [hits, lookups] if lookups else None,
    }


def compare_policies(policies: dict) -> dict | None:
    """Turns 2+ under first-free over affinity, per-round medians as the passes: above 1, affinity answers sooner."""
    a, f = (policies.get(policy, {}).get("ttft_later_per_run_s") for policy in ("affinity", "first-free"))
    if not a or not f:
        return None
    v = stats.decide(a, f)
    return {"decision": v.decision, "ratio": v.ratio, "lo": v.lo, "hi": v.hi, "n": [v.n_base, v.n_cand]}


def routing_summary(rows: list[dict], runs: list[dict], rounds: int) -> dict:
    policies = {POLICIES[s]: summarize_policy(mine, [x for x in runs if x["stack"] == s])
                for s, mine in grouped(rows, "stack").items() if s in POLICIES}
    notes = [] if any(p["prefix_cache"] for p in policies.values()) else [
        "the workers export no prefix cache: routing cannot shorten a turn yet, only move it"]
    return {"policies": policies, "comparison": compare_policies(policies), "notes": notes + few_rounds(rounds),
            "ttft_by_turn": ttft_by_turn(rows)}


def _rate(rate: float | None, counts: list | None) -> str:
    return "-" if rate is None or not counts else f"{rate * 100:.0f}% ({counts[0]:g} of {counts[1]:g})"


def routing_lines(report: dict) -> list[str]:
    """`--routing`'s table: one block per policy, then the comparison (never a lone ratio)."""
    sz = report["meta"]["sizes"]
    lines = [f"{sz['sessions']} conversations x {sz['turns'][1]} turns through the proxy, {BACKENDS} workers of width "
             f"{WIDTH}, {sz['answer_tokens']} answer tokens, tool pauses {sz['pause']:g} s on average"
             + (f" and {sz['output_lines']} lines of tool output" if sz.get("output_lines") else "") + ", "
             f"{sz['rounds']} round(s) per policy, alternated"]
    for policy, s in report["summary"]["policies"].items():
        lines += [f"{policy}:", f"  TTFT turns 2+   {fmt(s['ttft_later_s'], ' s')}",
                  f"  TTFT turn 1     {fmt(s['ttft_turn1_s'], ' s')}",
                  f"  prompt tokens   {fmt(s['prompt_tokens'], '', 0)}",
                  f"  affinity hits   {_rate(s['affinity_hit_rate'], s['affinity_hits'])} of turns 2+ on the previous "
                  "turn's worker",
                  f"  cached tokens   {_rate(s['cached_share_later'], s['cached_tokens_later'])} of turns 2+'s prompt "
                  "tokens",
                  "  routing         " + (", ".join(f"{k} {v}" for k, v in sorted(s["decisions"].items())) or "-"),
                  f"  prefix cache    {_rate(s['prefix_cache_hit_rate'], s['prefix_cache'])}"
                  + ("" if s["prefix_cache"] else " (the workers export no prefix-cache series)")]
    c = report["summary"].get("comparison")
    if c is None:
        lines.append("comparison: n/a")
    elif c["decision"] == "too few passes":
        lines.append(f"comparison: too few passes ({c['n'][0]} and {c['n'][1]} runs; {stats.MIN_PASSES} each needed): "
                     "rerun with --rounds 3 or more")
    else:
        verdict = "affinity answers sooner" if c["decision"] == "adopt" else "not significant"
        lines.append(f"comparison: {verdict}: TTFT turns 2+, first-free / affinity {c['ratio']:.2f}x "
                     f"({c['lo']:.2f}-{c['hi']:.2f}, 95% bootstrap, per-run medians, n={c['n'][0]}+{c['n'][1]})")
    return lines + [f"note: {note}" for note in report["summary"].get("notes", [])]


# -- the stacks -------------------------------------------------------------------------------


@dataclass
class Running:
    """One started stack: the front agents send `model` to, the backends behind it (serving `backend_model`)."""

    name: str
    model: str
    procs: Processes
    front: Process
    backends: list[Process]
    backend_model: str


def litellm_config(ports: list[int], target: Path) -> dict:
    """Two deployments of one model name behind LiteLLM's router, `least-busy`, with the master key its proxy
    wants; LiteLLM's other defaults stay (its retries included), save the timeouts, raised as for nginx."""
    return {
        "model_list": [{"model_name": "bench", "litellm_params": {
            "model": f"openai/{target}", "api_base": f"http://127.0.0.1:{port}/v1", "api_key": "none",
            "timeout": REQUEST_TIMEOUT, "stream_timeout": REQUEST_TIMEOUT}} for port in ports],
        "router_settings": {"routing_strategy": "least-busy"},
        "litellm_settings": {"request_timeout": REQUEST_TIMEOUT, "drop_params": True},
        "general_settings": {"master_key": API_KEY},
    }


def litellm_program() -> str:
    """The `litellm` executable of .venv-litellm, made (or found up to date) by scripts/bootstrap-litellm."""
    done = subprocess.run([str(ROOT / "scripts" / "bootstrap-litellm")], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: scripts/bootstrap-litellm failed:\n{done.stderr[-2000:]}\n\n"
                         "hint: it installs LiteLLM from PyPI into .venv-litellm; run it by hand to see why")
    return done.stdout.strip().splitlines()[-1]


def start_stack(name: str, target: Path, head: Path, args, rundir: Path, programs: dict) -> Running:
    """mtpstack's fleet, or `BACKENDS` mlx_lm.server at the validator's mlx-lm argv behind LiteLLM or nginx."""
    if name.startswith("mtpstack"):
        wait = {"affinityWaitSeconds": args.affinity_wait} if name == "mtpstack-wait" else {}
        procs, proxy, workers = start_fleet(POLICIES.get(name, "affinity"), target, head, WIDTH, args.depth, BACKENDS,
                                            rundir, **wait)
        return Running(name, "bench", procs, proxy, workers, "bench")
    rundir.mkdir(parents=True, exist_ok=True)
    procs, ports, port = Processes(), [free_port() for _ in range(BACKENDS)], free_port()
    model = served_model("mlx_lm.server", target)
    try:
        commands = {f"mlx_lm.server {i}": (worker_command(worker_profile(target, None, args.depth, p, backend="mlx-lm",
                                                                        width=WIDTH)), p) for i, p in enumerate(ports)}
        backends = list(start_workers(commands, rundir, procs, timeout=600).values())
        if name == "nginx":
            front = start_nginx(procs, programs["nginx"], rundir, {port: ports}, read_timeout_s=REQUEST_TIMEOUT)
            front.wait_ready("/health", 300)
            return Running(name, model, procs, front, backends, model)
        (rundir / "litellm.yaml").write_text(yaml.safe_dump(litellm_config(ports, target)))
        front = procs.start([programs["litellm"], "--config", str(rundir / "litellm.yaml"), "--host", "127.0.0.1",
                             "--port", str(port)], log_path=rundir / "litellm.log", name=name, kind="proxy",
                            url=url_of("127.0.0.1", port),
                            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"})
        front.wait_ready("/health/liveliness", 300)
        return Running(name, "bench", procs, front, backends, model)
    except BaseException:
        procs.stop_all()
        raise


async def warm_up(running: Running, front: bool = True) -> None:
    """One tiny request to each backend directly (a fresh process compiles on its first) and (`front`) one
    through the front; none primes a cache. `--routing` warms the workers only, so they count only its turns."""
    ends = [(b, running.backend_model, "warm up") for b in running.backends]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as http:
        for proc, model, text in ends + ([(running.front, running.model, "warm up the front")] if front else []):
            r = await one_turn(http, proc.url + "/v1", model, [{"role": "user", "content": text}], 2)
            if r["status"] != "ok":
                raise RuntimeError(f"{running.name}: warm-up of {proc.label} failed: {r['error']}")


def worker_counts(running: Running) -> dict:
    """mtpstack only: the workers' prefix-cache and draft counters and the proxy's routing decisions."""
    names = {"prefix_cache_hits": series.PREFIX_CACHE_HITS, "prefix_cache_lookups": series.PREFIX_CACHE_LOOKUPS,
             "drafted": series.TOKENS_DRAFTED, "accepted": series.TOKENS_ACCEPTED}
    workers, proxy = [metrics(w.url) for w in running.backends], metrics(running.front.url)
    return {**{key: sum(sample(s, name) or 0.0 for s in workers) for key, name in names.items()},
            "routing": {decision: sample(proxy, "mtpstack_proxy_routing_total", model="bench", decision=decision) or 0.0
                        for decision in ("affinity", "fallback_busy", "new")}}


def cpu_used(pid: int, since: float) -> float:
    """CPU seconds since `since`; NaN for a process that ended during the run (its row still counts)."""
    try:
        return cpu_seconds(pid) - since
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")


async def one_run(name: str, rnd: int, sessions: list, args, sizes: dict, target: Path, head: Path, workdir: Path,
                  programs: dict) -> tuple[list[dict], dict]:
    rundir = workdir / f"round{rnd}-{name}"
    t_start = time.perf_counter()
    running = await asyncio.to_thread(start_stack, name, target, head, args, rundir, programs)
    try:
        started_s = time.perf_counter() - t_start
        await warm_up(running, front=not args.routing)
        cpu0, load0 = {p: cpu_seconds(p.pid) for p in [running.front, *running.backends]}, os.getloadavg()
        rows = await run_sessions(running.front.url + "/v1", running.model, sessions, sizes["answer_tokens"],
                                  labels={"stack": name, "round": rnd}, tag=f"fleet-{name}-{rnd}",
                                  extra=EXTRA["routing" if args.routing else "sessions"])
        cpu_s, load1 = {p.label: cpu_used(p.pid, c) for p, c in cpu0.items()}, os.getloadavg()
        extra = await asyncio.to_thread(worker_counts, running) if name.startswith("mtpstack") else None
    finally:
        await asyncio.to_thread(running.procs.stop_all, timeout=30)
    if name.startswith("mtpstack"):  # which worker served each turn, and why: the proxy's request log
        logged = request_lines(rundir / "proxy.log")
        for r in rows:
            line = logged.get(r["request_id"], {})
            r["worker"], r["routing"] = line.get("worker"), line.get("routing")
    info = {"stack": name, "round": rnd, "startup_s": round(started_s, 1), "loadavg_start": list(load0),
            "loadavg_end": list(load1), "cpu_s": cpu_s, "metrics": round_metrics(rows), "workers": extra,
            "logs": str(rundir)}
    return rows, info


def request_lines(log: Path) -> dict[str, dict]:
    """The proxy's request log lines by request id: which worker served each turn, and why."""
    return {e["request_id"]: e for e in request_events(log) if e.get("request_id")}


def summary_of(rows: list[dict], rounds: int) -> dict:
    summary = {"stacks": summarize_stacks(rows), "compare": compare(rows), "ttft_by_turn": ttft_by_turn(rows)}
    summary["goal"] = goal_lines(summary)
    summary["notes"] = few_rounds(rounds)
    return summary


def few_rounds(rounds: int) -> list[str]:
    """The note a report carries when its rounds are too few for a verdict."""
    return [f"{rounds} round(s): figures, not a verdict; rerun with --rounds {stats.MIN_PASSES} or more"
            ] if rounds < stats.MIN_PASSES else []


def routing_sessions(rnd: int, sizes: dict) -> list:
    """`--routing`'s conversations of round `rnd`: the round's system prompt, each opened by its own task."""
    system = system_prompt(rnd, sizes["tools"])
    return [conversation(c, system, first_question(c), sizes["turns"][1], pause=sizes["pause"], rnd=rnd,
                         output_lines=sizes["output_lines"]) for c in range(sizes["sessions"])]


async def run_all(args, sizes: dict, workdir: Path) -> dict:
    target, head, source = await asyncio.to_thread(demo_pair, workdir, sizes["mlp_multiplier"], sizes["extra_layers"],
                                                   CONTEXT if args.routing else None)
    cpt = sessions = None
    if not args.routing:  # tool outputs sized in the served model's tokens
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(target / "tokenizer.json"))
        cpt = calibrate(lambda text: len(tok.encode(text, add_special_tokens=False).ids), args.seed, sizes)
        sessions = make_workload(args.seed, sizes, cpt)
    print(f"models: {source}\n  target {target}\n  head {head}" + ("" if args.routing else
          f"\n  tool outputs at {cpt:.2f} characters per token"), file=sys.stderr)
    found = {"litellm": litellm_program, "nginx": nginx_program}
    programs = {name: await asyncio.to_thread(find) for name, find in found.items() if name in args.stacks}
    if "nginx" in programs and not programs["nginx"]:
        raise SystemExit("error: nginx is not installed\n\nhint: apt-get install nginx-light (or pass --stacks "
                         "without nginx)")
    rows: list[dict] = []
    runs: list[dict] = []
    load_start = list(os.getloadavg())
    started = time.monotonic()
    for rnd in range(sizes["rounds"]):
        for name in rotated(args.stacks, rnd):  # so that no stack always runs first or last
            workload = sessions or routing_sessions(rnd, sizes)
            r, info = await one_run(name, rnd, workload, args, sizes, target, head, workdir, programs)
            rows += r
            runs.append(info)
            m = info["metrics"]
            print(f"round {rnd + 1}/{sizes['rounds']}: {name}: TTFT p95 {m['ttft_p95']}, turn p95 {m['turn_p95']}, "
                  f"{m['tok_s']} tok/s, errors {m['error']}, 429 {m['429']}, timeouts {m['timeout']} "
                  f"({time.monotonic() - started:.0f} s so far)", file=sys.stderr)
            if args.routing:  # its figures are of whole conversations: a failed turn stops the run
                answered(r)
    meta = run_meta(models=source, target=str(target), head=str(head), sizes=sizes, seed=args.seed, depth=args.depth,
                    width=WIDTH, backends=BACKENDS, stacks=list(args.stacks), chars_per_token=cpt,
                    rounds_run=sizes["rounds"], loadavg_start=load_start, loadavg_end=list(os.getloadavg()),
                    seconds=round(time.monotonic() - started))
    litellm = sorted((ROOT / ".venv-litellm").glob("lib/python*/site-packages/litellm-*.dist-info"))
    meta["versions"].update(aiohttp=version_of("aiohttp"), litellm=litellm[-1].name.split("-")[1] if litellm else None,
                            nginx=nginx_version(programs.get("nginx")))
    summary = routing_summary(rows, runs, sizes["rounds"]) if args.routing else summary_of(rows, sizes["rounds"])
    return {"meta": meta, "summary": summary, "runs": runs, "rows": rows}


async def replay_only(args, sizes: dict) -> dict:
    """`--url`: the workload against a server already running (sized at the default characters per token)."""
    load_start = list(os.getloadavg())
    rows = await run_sessions(args.url.rstrip("/"), args.model, make_workload(args.seed, sizes), sizes["answer_tokens"],
                              labels={"stack": "server", "round": 0}, tag="fleet-server-0", extra=EXTRA["sessions"])
    meta = run_meta(models=args.model, sizes=sizes, seed=args.seed, rounds_run=1, loadavg_start=load_start,
                    loadavg_end=list(os.getloadavg()))
    return {"meta": meta, "summary": summary_of(rows, 1), "runs": [], "rows": rows}


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    a, b = int(lo), int(hi or lo)
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"expected N or N-M with 1 <= N <= M: {text}")
    return a, b


#: The options that size a run: key -> (flag, type, what, the least it may be); unset: the mode's size.
SIZE_OPTIONS = {
    "rounds": ("--rounds", int, "rounds, each stack once per round", 1),
    "sessions": ("--sessions", int, "agent sessions", 1),
    "turns": ("--turns", parse_range, "turns per session, N or N-M", 1),
    "output_tokens": ("--output-tokens", parse_range, "tokens of each tool output, N-M", 1),
    "arrival_s": ("--arrival", float, "mean seconds between session arrivals", 0),
    "mlp_multiplier": ("--mlp-multiplier", int, "widen the target's MLPs", 1),
    "extra_layers": ("--extra-layers", int, "zero layers appended to the target", 0),
    "output_lines": ("--output-lines", int, "lines of tool output before each follow-up (20 adds about 800 tokens "
                     "a turn with the demo tokenizer, which a moved turn prefills again)", 0),
}


def _shown(value) -> str:
    """A size as `--help` shows it: N, or N-M for a range."""
    lo, hi = value if isinstance(value, tuple) else (value, value)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def parser() -> argparse.ArgumentParser:
    from mtpstack.validator import DEPTH_DEFAULT

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a few minutes: the demo pair as it is, 3 sessions of 2-3 turns (--routing: 12 tools, 3 "
                   "turns), 1 round")
    p.add_argument("--routing", action="store_true",
                   help="affinity against first-free on four agent conversations fed their answers")
    for key, (flag, kind, what, _) in SIZE_OPTIONS.items():
        defaults = "; ".join(f"{mode}{_shown(sizes[key])}" for mode, sizes in (("", FULL), ("--routing ", ROUTING))
                             if key in sizes)
        p.add_argument(flag, type=kind, dest=key, help=f"{what} (default: {defaults})")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed (default: 0)")
    p.add_argument("--depth", type=int, default=DEPTH_DEFAULT,
                   help=f"the MTP head's draft depth in mtpstack's workers (default: {DEPTH_DEFAULT})")
    p.add_argument("--stacks", nargs="+", choices=STACKS + EXTRA_STACKS,
                   help="stacks to run (default: the three; --routing: mtpstack mtpstack-first-free; "
                   "mtpstack-wait: mtpstack with --affinity-wait)")
    p.add_argument("--affinity-wait", type=float, default=5.0,
                   help="mtpstack-wait's proxy.affinityWaitSeconds (default: 5)")
    p.add_argument("--url", help="replay against this OpenAI-compatible base URL (e.g. http://127.0.0.1:8080/v1) "
                   "instead of starting stacks")
    p.add_argument("--model", default="mtpstack-demo", help="with --url: the model name to send (default: %(default)s)")
    p.add_argument("--out", help="a folder for fleet.json and ttft-by-turn.png (default: a new one under bench/out/)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    sizes = dict((ROUTING_QUICK if args.quick else ROUTING) if args.routing else (QUICK if args.quick else FULL))
    sizes.update({key: getattr(args, key) for key in SIZE_OPTIONS if getattr(args, key) is not None})
    for key, (flag, _, _, least) in SIZE_OPTIONS.items():
        if not isinstance(sizes.get(key, least), tuple) and sizes.get(key, least) < least:
            p.error(f"{flag} must be at least {least}")
    if args.routing and args.url:
        p.error("--routing starts its own stacks: no --url")
    args.stacks = args.stacks or (list(POLICIES) if args.routing else list(STACKS))
    out = Path(args.out) if args.out else ROOT / "bench" / "out" / time.strftime("fleet-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    if args.url:
        report = asyncio.run(replay_only(args, sizes))
    else:
        ensure_preload()
        report = asyncio.run(run_all(args, sizes, Path(tempfile.mkdtemp(prefix="fleet-bench-"))))
    emit(report, routing_lines(report) if args.routing else format_lines(report), out / "fleet.json")
    plot_ttft_by_turn(report["summary"]["ttft_by_turn"], out / "ttft-by-turn.png",
                      f"{report['meta']['sizes']['sessions']} agent sessions, TTFT by turn")
    print(f"figures: {out / 'fleet.json'}, plot: {out / 'ttft-by-turn.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
