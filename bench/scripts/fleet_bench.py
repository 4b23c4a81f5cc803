"""Fleet benchmark: the whole stack against the stacks people build instead, on an agent workload;
and, `--routing`, the proxy's `affinity` routing against `first-free` on agent conversations.

The seeded workload (`workloads.make_workload`) goes to each stack, started fresh per round in rotating
order on the demo target widened: `mtpstack` (the proxy before two native workers with the MTP head),
`litellm` (LiteLLM's proxy, `least-busy`, from scripts/bootstrap-litellm) and `nginx` (round-robin), both
before two `mlx_lm.server` processes at the validator's mlx-lm argv. `--routing`: mtpstack under both
policies on four of the agent bench's conversations fed their answers, after tool pauses.
The method and the figures: docs/bench.md, and docs/proxy.md's benchmark of routing.

    python bench/scripts/fleet_bench.py --out bench/out/fleet        # 3 rounds, the widened target
    python bench/scripts/fleet_bench.py --quick                        # a few minutes: small and short
    python bench/scripts/fleet_bench.py --url http://HOST:PORT/v1 --model NAME   # replay against any server
    python bench/scripts/fleet_bench.py --routing --out /tmp/routing-bench   # 3 rounds, the widened target
    python bench/scripts/fleet_bench.py --routing --quick                     # not widened, 12 tools, 3 turns

The JSON (raw rows and summaries) and the plot go to `--out`; the readable table to stderr.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from mtpstack import series
from mtpstack.bench import stats
from mtpstack.bench.conversations import API_KEY, REQUEST_TIMEOUT, STATUSES, answered, one_turn, run_sessions
from mtpstack.bench.parts import demo_pair, ensure_preload, fmt, rotated, run_meta, spread, version_of
from mtpstack.bench.report import figure, save_figure
from mtpstack.bench.servers import metrics, start_workers, worker_command, worker_profile
from mtpstack.bench.load import request_events
from mtpstack.bench.stacks import cpu_seconds, fleet, nginx_conf, start_fleet
from mtpstack.bench.workloads import (ANSWER_TOKENS, CONTEXT, TOOLS, TURNS, calibrate, conversation, first_question,
                                      make_workload, system_prompt)
from mtpstack.proxy.prometheus import sample
from mtpstack.runtime import Processes, free_port, url_of

ROOT = _checkout.ROOT
STACKS = ("mtpstack", "litellm", "nginx")
BASE_STACK = "mtpstack"
#: `--stacks` beyond the three: mtpstack with `proxy.affinityWaitSeconds` at `--affinity-wait`, and with
#: `first-free` routing (`--routing`, whose table names each stack by its `POLICIES`).
EXTRA_STACKS = ("mtpstack-wait", "mtpstack-first-free")
POLICIES = {"mtpstack": "affinity", "mtpstack-first-free": "first-free"}
#: Two backends per stack of this batch width each: `--routing`'s four conversations each have a slot, so
#: routing is about where a turn goes, not about queueing.
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
#: The body's extra fields: the fleet's sessions carry their tools and thinking off, so that every stack
#: renders the same prompt (`mlx_lm.server` turns a template's thinking on unless told, the native worker
#: keeps the template's default); the routing conversations run every answer to `max_tokens`, as agent_bench's.
EXTRA = {"sessions": {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
         "routing": {"ignore_eos": True}}


# -- summaries (pure) ---------------------------------------------------------------------------

#: Per-round figures: name -> (what, True when higher is better, the table's header and width, its
#: digits and scale: the cached share a percentage).
METRICS = {
    "ttft_p50": ("turn TTFT p50", False, "TTFT p50 s", 18, 2, 1),
    "ttft_p95": ("turn TTFT p95", False, "TTFT p95 s", 18, 2, 1),
    "turn_p50": ("turn time p50", False, "turn p50 s", 18, 2, 1),
    "turn_p95": ("turn time p95", False, "turn p95 s", 18, 2, 1),
    "tok_s": ("output tok/s", True, "out tok/s", 18, 1, 1),
    "cached_share": ("prompt tokens from a cache", True, "cached", 14, 0, 100),
}
COUNTS = STATUSES[1:]  # the failures
#: The latency percentiles: the figure's name -> (the row's field, the percentile).
PERCENTILES = {f"{name}_p{q}": (key, q) for name, key in (("ttft", "ttft_s"), ("turn", "total_s")) for q in (50, 95)}


def round_metrics(rows: list[dict]) -> dict:
    """One run's figures from its turns: latencies over the answered turns, throughput over the span from
    the first request to the last answer, the counts of each failure."""
    ok = [r for r in rows if r["status"] == "ok"]
    out: dict = {"tok_s": None, "cached_share": None, "turns": len(rows)}
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
    for status in COUNTS:
        out[status] = sum(r["status"] == status for r in rows)
    return out


def measured(values: list) -> dict | None:
    """`parts.spread` of the values measured (not None); None when there are none."""
    s = spread([x for x in values if x is not None])
    return s if s["n"] else None


def per_round(rows: list[dict]) -> list[dict]:
    """`round_metrics` of each round of `rows` (one stack's)."""
    return [round_metrics([r for r in rows if r["round"] == rnd]) for rnd in sorted({r["round"] for r in rows})]


def summarize_stacks(rows: list[dict]) -> dict:
    """Per stack: every figure of `round_metrics` as the median over rounds with min-max."""
    out = {}
    for stack in dict.fromkeys(r["stack"] for r in rows):
        per_round_ = per_round([r for r in rows if r["stack"] == stack])
        out[stack] = {k: measured([m[k] for m in per_round_]) for k in (*METRICS, *COUNTS)}
        out[stack]["turns"] = sum(m["turns"] for m in per_round_)
        out[stack]["rounds"] = len(per_round_)
    return out


def _clusters(rows: list[dict], key: str) -> list[list[float]]:
    """The answered turns' `key` values, one list per session of each round."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r["status"] == "ok" and r.get(key) is not None:
            groups.setdefault((r["round"], r["session"]), []).append(r[key])
    return list(groups.values())


def compare(rows: list[dict], base: str = BASE_STACK, resamples: int = 2000) -> dict:
    """Each other stack over `base`, per figure: the ratio and its 95% bootstrap interval. Latency
    percentiles pool the turns and resample whole sessions; throughput is the ratio of the per-round
    medians, resampling rounds (`stats.ratio_ci`; fewer than `stats.MIN_PASSES` rounds a side: no interval)."""
    out: dict = {}
    base_rows = [r for r in rows if r["stack"] == base]
    for stack in dict.fromkeys(r["stack"] for r in rows):
        if stack == base:
            continue
        mine = [r for r in rows if r["stack"] == stack]
        cell = {}
        for name, (key, q) in PERCENTILES.items():
            b, c = _clusters(base_rows, key), _clusters(mine, key)
            if b and c:
                ratio, lo, hi = stats.cluster_ratio_ci(b, c, lambda v, q=q: stats.percentile(v, q), resamples=resamples)
                cell[name] = {"ratio": ratio, "lo": lo, "hi": hi, "n": [len(b), len(c)], "unit": "sessions"}
        tb, tc = ([m["tok_s"] for m in per_round(side) if m["tok_s"]] for side in (base_rows, mine))
        if tb and tc:
            if min(len(tb), len(tc)) >= stats.MIN_PASSES:
                ratio, lo, hi = stats.ratio_ci(tb, tc, resamples=resamples)
            else:
                ratio, lo, hi = stats.median(tc) / stats.median(tb), None, None
            cell["tok_s"] = {"ratio": ratio, "lo": lo, "hi": hi, "n": [len(tb), len(tc)], "unit": "rounds"}
        out[stack] = cell
    return out


def ttft_by_turn(rows: list[dict]) -> dict:
    """Per stack and turn number: median, p95 and count of the answered turns' TTFT (all sessions and rounds)."""
    out: dict = {}
    for stack in dict.fromkeys(r["stack"] for r in rows):
        turns: dict[int, list[float]] = {}
        for r in rows:
            if r["stack"] == stack and r["status"] == "ok" and r.get("ttft_s") is not None:
                turns.setdefault(r["turn"], []).append(r["ttft_s"])
        out[stack] = [{"turn": t, "median": stats.median(v), "p95": stats.percentile(v, 95), "n": len(v)}
                      for t, v in sorted(turns.items())]
    return out


def _count(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{s['median']:g}" if s["min"] == s["max"] else f"{s['median']:g} ({s['min']:g}-{s['max']:g})"


def format_lines(report: dict) -> list[str]:
    """The table a person reads: a row per stack (median over rounds, min-max), then each stack against
    mtpstack with its interval, then the goal, stated as met or not."""
    m = report["meta"]
    sz = m["sizes"]
    lines = [f"{sz['sessions']} agent sessions x {sz['turns'][0]}-{sz['turns'][1]} turns (tool outputs "
             f"{sz['output_tokens'][0]}-{sz['output_tokens'][1]} tokens, {sz['answer_tokens']} answer tokens at most), "
             f"{m['rounds_run']} round(s), stacks alternated; model: {m.get('models', '?')}",
             f"load average {m.get('loadavg_start', ['?'])[0]} at the start, {m.get('loadavg_end', ['?'])[0]} at the end; "
             "figures: median over rounds (min-max)"]
    head = (f"{'stack':<10} " + " ".join(f"{header:>{w}}" for _, _, header, w, _, _ in METRICS.values()) + " "
            + " ".join(f"{header:>4}" for header in ("err", "429", "t/o")))
    lines += [head, "-" * len(head)]
    for stack, s in report["summary"]["stacks"].items():
        cells = [f"{fmt(s[key], '%' if scale == 100 else '', digits, scale=scale, count=False, missing='-'):>{w}}"
                 for key, (_, _, _, w, digits, scale) in METRICS.items()]
        lines.append(f"{stack:<10} " + " ".join(cells) + " " + " ".join(f"{_count(s[c]):>4}" for c in COUNTS))
    for stack, cell in report["summary"]["compare"].items():
        lines.append(f"{stack} / {BASE_STACK}: " + "; ".join(
            f"{METRICS[key][0]} {c['ratio']:.2f}x " + ("(too few rounds for an interval)" if c["lo"] is None
                                                       else f"[{c['lo']:.2f}, {c['hi']:.2f}]") for key, c in cell.items()))
    summary = report["summary"]
    return lines + [f"goal: {note}" for note in summary.get("goal", [])] + [f"note: {n}" for n in summary.get("notes", [])]


def goal_lines(summary: dict, base: str = BASE_STACK) -> list[str]:
    """The issue's goal, figure by figure: is `base` best, with zero errors?"""
    stacks = summary["stacks"]
    if base not in stacks or len(stacks) < 2:
        return []
    out = []
    for key in ("ttft_p95", "turn_p95", "tok_s"):
        what, higher = METRICS[key][:2]
        values = {k: v[key]["median"] for k, v in stacks.items() if v.get(key)}
        if base not in values:
            continue
        best = max(values, key=values.get) if higher else min(values, key=values.get)
        out.append(f"{what}: {'met' if best == base else 'not met'}: best is {best} ({values[best]:.3g}), {base} {values[base]:.3g}")
    failures = {k: sum((v[c] or {}).get("max", 0) or 0 for c in COUNTS) for k, v in stacks.items()}
    out.append(f"zero errors, 429s and timeouts for {base}: {'met' if failures[base] == 0 else 'not met'}")
    return out


def plot_ttft_by_turn(by_turn: dict, path: str | Path, title: str = "") -> Path:
    """TTFT by turn number, one line per stack: the median (solid) and p95 (dashed), log scale."""
    fig, ax = figure(figsize=(7.0, 4.2))
    for i, (stack, points) in enumerate(by_turn.items()):
        if not points:
            continue
        xs = [p["turn"] for p in points]
        ax.plot(xs, [p["median"] for p in points], "o-", color=f"C{i}", label=f"{stack} median")
        ax.plot(xs, [p["p95"] for p in points], "x--", color=f"C{i}", alpha=0.7, label=f"{stack} p95")
    ax.set_yscale("log")
    turns = sorted({p["turn"] for points in by_turn.values() for p in points})
    if turns:
        ax.set_xticks(turns)
    ax.set_xlabel("turn of the session")
    ax.set_ylabel("time to first token, s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", ncol=len(by_turn))
    if title:
        ax.set_title(title, fontsize="medium")
    return save_figure(fig, path)


# -- `--routing`'s summaries (pure) -------------------------------------------------------------


def stayed(rows: list[dict]) -> list[bool]:
    """For each turn 2+ with both ends known: did the worker of the session's previous turn serve it?"""
    by_session: dict[tuple, dict[int, str | None]] = {}
    for r in rows:
        by_session.setdefault((r["stack"], r["round"], r["session"]), {})[r["turn"]] = r.get("worker")
    return [worker == turns[t - 1] for turns in by_session.values() for t, worker in sorted(turns.items())
            if t >= 2 and worker is not None and turns.get(t - 1) is not None]


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def summarize_policy(rows: list[dict], runs: list[dict]) -> dict:
    """One policy's rows and runs: TTFT of turns 2+ (and per round) beside turn 1's, the affinity hits,
    the routing decisions, the cached share of turns 2+'s prompt tokens, the workers' prefix-cache hits."""
    later = [r for r in rows if r["turn"] >= 2]
    kept = stayed(rows)
    decisions: dict[str, int] = {}
    for r in rows:
        if r.get("routing"):
            decisions[r["routing"]] = decisions.get(r["routing"], 0) + 1
    prompted = [r for r in later if r.get("prompt_tokens")]
    prompt_later = sum(r["prompt_tokens"] for r in prompted)
    cached_later = sum(r.get("cached_tokens") or 0 for r in prompted)
    counts = [run["workers"] for run in runs if run.get("workers")]
    hits, lookups = sum(c["prefix_cache_hits"] for c in counts), sum(c["prefix_cache_lookups"] for c in counts)
    return {
        "ttft_turn1_s": measured([r["ttft_s"] for r in rows if r["turn"] == 1]),
        "ttft_later_s": measured([r["ttft_s"] for r in later]),
        "ttft_later_per_run_s": [stats.median(v) for v in ([r["ttft_s"] for r in later if r["round"] == rnd]
                                                           for rnd in sorted({r["round"] for r in later})) if v],
        "prompt_tokens": measured([r["prompt_tokens"] for r in rows if r.get("prompt_tokens")]),
        "affinity_hit_rate": _share(sum(kept), len(kept)), "affinity_hits": [sum(kept), len(kept)],
        "decisions": decisions,
        "cached_share_later": _share(cached_later, prompt_later), "cached_tokens_later": [cached_later, prompt_later],
        "prefix_cache_hit_rate": _share(hits, lookups), "prefix_cache": [hits, lookups] if lookups else None,
    }


def compare_policies(policies: dict) -> dict | None:
    """Turns 2+ under first-free over affinity, per-round medians as the passes: above 1, affinity answers sooner."""
    a = policies.get("affinity", {}).get("ttft_later_per_run_s") or []
    f = policies.get("first-free", {}).get("ttft_later_per_run_s") or []
    if not a or not f:
        return None
    v = stats.decide(a, f)
    return {"decision": v.decision, "ratio": v.ratio, "lo": v.lo, "hi": v.hi, "n": [v.n_base, v.n_cand]}


def routing_summary(rows: list[dict], runs: list[dict], rounds: int) -> dict:
    policies = {POLICIES[s]: summarize_policy([r for r in rows if r["stack"] == s], [x for x in runs if x["stack"] == s])
                for s in dict.fromkeys(r["stack"] for r in rows) if s in POLICIES}
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
                  f"  TTFT turn 1     {fmt(s['ttft_turn1_s'], ' s')}", f"  prompt tokens   {fmt(s['prompt_tokens'], '', 0)}",
                  f"  affinity hits   {_rate(s['affinity_hit_rate'], s['affinity_hits'])} of turns 2+ on the previous "
                  "turn's worker",
                  f"  cached tokens   {_rate(s['cached_share_later'], s['cached_tokens_later'])} of turns 2+'s prompt tokens",
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
    """One started stack: where agents send their turns, and its processes (the front one first)."""

    name: str
    base_url: str
    model: str
    procs: object  # mtpstack.runtime.Processes
    front: object  # the Process agents talk to
    backends: list
    #: The model name each backend expects when warmed up directly.
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


def nginx_program() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not found:
        raise SystemExit("error: nginx is not installed\n\nhint: apt-get install nginx-light (or pass --stacks without nginx)")
    return found


def start_stack(name: str, target: Path, head: Path, args, rundir: Path, programs: dict) -> Running:
    """mtpstack's fleet, or `BACKENDS` mlx_lm.server processes at the validator's mlx-lm argv (batch width
    `WIDTH`, the default prompt cache) behind LiteLLM or nginx."""
    rundir.mkdir(parents=True, exist_ok=True)
    if name.startswith("mtpstack"):
        ports = {f"w{i}": free_port() for i in range(BACKENDS)}
        data = fleet(POLICIES.get(name, "affinity"), target, head, WIDTH, args.depth, ports, free_port())
        if name == "mtpstack-wait":
            data["proxy"]["affinityWaitSeconds"] = args.affinity_wait
        procs, proxy, workers = start_fleet(data, rundir)
        return Running(name, proxy.url + "/v1", "bench", procs, proxy, workers, "bench")
    procs, ports, port = Processes(), [free_port() for _ in range(BACKENDS)], free_port()
    try:
        commands = {f"mlx_lm.server {i}": (worker_command(worker_profile(target, None, args.depth, p, backend="mlx-lm",
                                                                        width=WIDTH)), p) for i, p in enumerate(ports)}
        backends = start_workers(commands, rundir, procs, timeout=600)
        if name == "litellm":
            (rundir / "litellm.yaml").write_text(yaml.safe_dump(litellm_config(ports, target)))
            argv = [programs["litellm"], "--config", str(rundir / "litellm.yaml"), "--host", "127.0.0.1",
                    "--port", str(port)]
            env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
            ready, model = "/health/liveliness", "bench"
        else:
            (rundir / "nginx.conf").write_text(nginx_conf(rundir, {port: ports}, read_timeout_s=REQUEST_TIMEOUT))
            argv = [programs["nginx"], "-c", str(rundir / "nginx.conf"), "-p", str(rundir)]
            env, ready, model = None, "/health", str(target)
        front = procs.start(argv, log_path=rundir / f"{name}.log", name=name, kind="proxy",
                            url=url_of("127.0.0.1", port), env=env)
        front.wait_ready(ready, 300)
        return Running(name, front.url + "/v1", model, procs, front, list(backends.values()), str(target))
    except BaseException:
        procs.stop_all()
        raise


async def warm_up(running: Running, front: bool = True) -> None:
    """The first forward of a fresh process compiles: one tiny request to each backend directly, then
    (`front`) one through the front (its own first request). Nothing of the workload: no cache is primed.
    `--routing` warms the workers only, so the proxy routes and the workers count only its turns."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as http:
        ends = [(b, b.url + "/v1", running.backend_model, "warm up") for b in running.backends]
        if front:
            ends.append((running.front, running.base_url, running.model, "warm up the front"))
        for proc, url, model, text in ends:
            r = await one_turn(http, url, model, [{"role": "user", "content": text}], 2)
            if r["status"] != "ok":
                raise RuntimeError(f"{running.name}: warm-up of {proc.label} failed: {r['error']}")


def cpu_of(procs: list) -> dict[str, float]:
    out = {}
    for p in procs:
        try:
            out[p.label] = cpu_seconds(p.pid)
        except (FileNotFoundError, ProcessLookupError):
            out[p.label] = float("nan")
    return out


def worker_counts(running: Running) -> dict:
    """mtpstack only: the workers' prefix-cache and draft counters and the proxy's routing decisions."""
    names = {"prefix_cache_hits": series.PREFIX_CACHE_HITS, "prefix_cache_lookups": series.PREFIX_CACHE_LOOKUPS,
             "drafted": series.TOKENS_DRAFTED, "accepted": series.TOKENS_ACCEPTED}
    workers, proxy = [metrics(w.url) for w in running.backends], metrics(running.front.url)
    return {**{key: sum(sample(s, name) or 0.0 for s in workers) for key, name in names.items()},
            "routing": {decision: sample(proxy, "mtpstack_proxy_routing_total", model="bench", decision=decision) or 0.0
                        for decision in ("affinity", "fallback_busy", "new")}}


async def one_run(name: str, rnd: int, sessions: list, args, sizes: dict, target: Path, head: Path, workdir: Path,
                  programs: dict) -> tuple[list[dict], dict]:
    rundir = workdir / f"round{rnd}-{name}"
    t_start = time.perf_counter()
    running = await asyncio.to_thread(start_stack, name, target, head, args, rundir, programs)
    try:
        started_s = time.perf_counter() - t_start
        await warm_up(running, front=not args.routing)
        procs = [running.front, *running.backends]
        cpu0, load0 = cpu_of(procs), os.getloadavg()
        rows = await run_sessions(running.base_url, running.model, sessions, sizes["answer_tokens"],
                                  labels={"stack": name, "round": rnd}, tag=f"fleet-{name}-{rnd}",
                                  extra=EXTRA["routing" if args.routing else "sessions"])
        cpu1, load1 = cpu_of(procs), os.getloadavg()
        extra = await asyncio.to_thread(worker_counts, running) if name.startswith("mtpstack") else None
    finally:
        await asyncio.to_thread(running.procs.stop_all, timeout=30)
    if name.startswith("mtpstack"):  # which worker served each turn, and why: the proxy's request log
        logged = request_lines(rundir / "proxy.log")
        for r in rows:
            line = logged.get(r["request_id"], {})
            r["worker"], r["routing"] = line.get("worker"), line.get("routing")
    info = {"stack": name, "round": rnd, "startup_s": round(started_s, 1), "loadavg_start": list(load0), "loadavg_end": list(load1),
            "cpu_s": {k: cpu1[k] - cpu0[k] for k in cpu0}, "metrics": round_metrics(rows), "workers": extra, "logs": str(rundir)}
    return rows, info


def request_lines(log: Path) -> dict[str, dict]:
    """The proxy's request log lines by request id: which worker served each turn, and why."""
    return {e["request_id"]: e for e in request_events(log) if e.get("request_id")}


def token_counter(target: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


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
    """`--routing`'s conversations of round `rnd`: one agent's system prompt (the round's, the same for
    both policies), each conversation opened by its own task."""
    system = system_prompt(rnd, sizes["tools"])
    return [conversation(c, system, first_question(c), sizes["turns"][1], pause=sizes["pause"], rnd=rnd,
                         output_lines=sizes["output_lines"]) for c in range(sizes["sessions"])]


async def run_all(args, sizes: dict, workdir: Path) -> dict:
    target, head, source = await asyncio.to_thread(demo_pair, workdir, sizes["mlp_multiplier"], sizes["extra_layers"],
                                                   CONTEXT if args.routing else None)
    cpt = None if args.routing else calibrate(token_counter(target), args.seed, sizes)
    sessions = None if args.routing else make_workload(args.seed, sizes, cpt)
    print(f"models: {source}\n  target {target}\n  head {head}" + ("" if args.routing else
          f"\n  tool outputs at {cpt:.2f} characters per token"), file=sys.stderr)
    found = {"litellm": litellm_program, "nginx": nginx_program}
    programs = {name: await asyncio.to_thread(find) for name, find in found.items() if name in args.stacks}
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
    meta["versions"] = versions()
    summary = routing_summary(rows, runs, sizes["rounds"]) if args.routing else summary_of(rows, sizes["rounds"])
    return {"meta": meta, "summary": summary, "runs": runs, "rows": rows}


def versions() -> dict:
    out = {dist: version_of(dist) for dist in ("mlx", "mlx-lm", "aiohttp")}
    found = sorted((ROOT / ".venv-litellm").glob("lib/python*/site-packages/litellm-*.dist-info"))
    out["litellm"] = found[-1].name.split("-")[1] if found else None
    try:
        out["nginx"] = subprocess.run([nginx_program(), "-v"], capture_output=True, text=True).stderr.strip()
    except SystemExit:
        out["nginx"] = None
    return out


async def replay_only(args, sizes: dict) -> dict:
    """`--url`: the workload against a server already running (sized at the default characters per token)."""
    load_start = list(os.getloadavg())
    rows = await run_sessions(args.url.rstrip("/"), args.model, make_workload(args.seed, sizes), sizes["answer_tokens"],
                              labels={"stack": args.label, "round": 0}, tag=f"fleet-{args.label}-0",
                              extra=EXTRA["sessions"])
    meta = run_meta(models=args.model, sizes=sizes, seed=args.seed, rounds_run=1, loadavg_start=load_start,
                    loadavg_end=list(os.getloadavg()))
    return {"meta": meta, "summary": summary_of(rows, 1), "runs": [], "rows": rows}


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    a, b = int(lo), int(hi or lo)
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"expected N or N-M with 1 <= N <= M: {text}")
    return a, b


#: The options that size a run: key -> (flag, type, what, the least it may be); unset, each is its mode's size
#: (`FULL`, `QUICK`, `ROUTING` or `ROUTING_QUICK`).
SIZE_OPTIONS = {
    "rounds": ("--rounds", int, "rounds, each stack once per round", 1),
    "sessions": ("--sessions", int, "agent sessions", 1),
    "turns": ("--turns", parse_range, "turns per session, N or N-M", 1),
    "output_tokens": ("--output-tokens", parse_range, "tokens of each tool output, N-M", 1),
    "answer_tokens": ("--answer-tokens", int, "max_tokens of each turn", 1),
    "arrival_s": ("--arrival", float, "mean seconds between session arrivals", 0),
    "mlp_multiplier": ("--mlp-multiplier", int, "widen the target's MLPs", 1),
    "extra_layers": ("--extra-layers", int, "zero layers appended to the target", 0),
    "tools": ("--tools", int, "tool lines in the system prompt", 0),
    "pause": ("--pause", float, "mean seconds a tool runs between turns", 0),
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
                   help="a few minutes: the demo pair as it is, 3 sessions of 2-3 turns (--routing: 12 tools, 3 turns), 1 round")
    p.add_argument("--routing", action="store_true",
                   help="affinity against first-free on four agent conversations fed their answers")
    for key, (flag, kind, what, _) in SIZE_OPTIONS.items():
        defaults = "; ".join(f"{mode}{_shown(sizes[key])}" for mode, sizes in (("", FULL), ("--routing ", ROUTING))
                             if key in sizes)
        p.add_argument(flag, type=kind, dest=key, help=f"{what} (default: {defaults})")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed (default: 0)")
    p.add_argument("--depth", type=int, default=DEPTH_DEFAULT, help=f"the MTP head's draft depth in mtpstack's workers (default: {DEPTH_DEFAULT})")
    p.add_argument("--stacks", nargs="+", choices=STACKS + EXTRA_STACKS,
                   help="stacks to run (default: the three; --routing: mtpstack mtpstack-first-free; "
                   "mtpstack-wait: mtpstack with --affinity-wait)")
    p.add_argument("--affinity-wait", type=float, default=5.0,
                   help="mtpstack-wait's proxy.affinityWaitSeconds (default: 5)")
    p.add_argument("--url", help="replay against this OpenAI-compatible base URL (e.g. http://127.0.0.1:8080/v1) instead of starting stacks")
    p.add_argument("--model", default="mtpstack-demo", help="with --url: the model name to send (default: mtpstack-demo)")
    p.add_argument("--label", default="server", help="with --url: the name its rows carry (default: server)")
    p.add_argument("--out", help="a folder for fleet.json and ttft-by-turn.png (default: a new folder under bench/out/)")
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
    (out / "fleet.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_ttft_by_turn(report["summary"]["ttft_by_turn"], out / "ttft-by-turn.png",
                      f"{report['meta']['sizes']['sessions']} agent sessions, TTFT by turn")
    print("\n".join(routing_lines(report) if args.routing else format_lines(report)), file=sys.stderr)
    print(f"figures: {out / 'fleet.json'}, plot: {out / 'ttft-by-turn.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
