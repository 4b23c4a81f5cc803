"""Routing benchmark: multi-turn agent conversations through the proxy, `affinity` routing against `first-free`.

A coding agent resends its whole conversation every turn: a long system prompt with its tool list,
then every turn so far, each greedy answer appended as the assistant turn (agent_bench.py's
conversation, each of the four opened by its own task), after a pause while its tool runs (the
same pauses under both policies). With a prefix cache in
each worker, a turn costs only its new tokens when it reaches the worker that served the previous
one. Four such conversations run at once through `mtpstack proxy` in front of two native workers
(the demo hybrid target with its MTP head), once per routing policy, the policies alternated
round by round (their order rotating), each run on freshly started processes (cold caches).

Measures, per policy:
  1. time to first token on turns 2+ (the turns a prefix cache can shorten): median and min-max,
     beside turn 1's;
  2. the affinity hit rate: the share of turns 2+ served by the worker that served the
     conversation's previous turn (known for both policies from the proxy's log), and the proxy's
     own routing decisions (`mtpstack_proxy_routing_total`);
  3. what the workers reused: the share of turns 2+'s prompt tokens answered from a cache
     (`usage.prompt_tokens_details.cached_tokens`) and each worker's prefix-cache hit rate
     (`mtpstack_worker_prefix_cache_*`).

    python bench/scripts/routing_bench.py --out bench-routing.json   # the demo target widened, 3 rounds
    python bench/scripts/routing_bench.py --quick                     # a minute or two: small and short

Raw rows and summaries go to stdout (or --out) as JSON; the readable table to stderr.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from mtpstack.bench import stats
from mtpstack.bench.parts import demo_pair, emit
from mtpstack.bench.servers import stream_chat
from mtpstack.bench.stacks import fleet, request_lines, start_fleet
from mtpstack.bench.workloads import ANSWER_TOKENS, CONTEXT, FOLLOW_UPS, TURNS, system_prompt

POLICIES = ("affinity", "first-free")
#: Two workers, four conversations at once: with a width of 2 every conversation has a slot, so
#: the comparison is about where a turn goes, not about queueing.
WORKERS = 2
CONVERSATIONS = 4
#: Bounds every exchange; a stuck server fails the run instead of hanging it.
REQUEST_TIMEOUT = 900
#: The sizes of a full run and of `--quick`.
#: The sizes of a full run (agent_bench's conversation) and of `--quick`.
FULL = {"tools": 40, "turns": TURNS, "answer_tokens": ANSWER_TOKENS, "rounds": 3, "pause": 2.0, "output_lines": 0, "mlp_multiplier": 8, "extra_layers": 10}
QUICK = {"tools": 12, "turns": 3, "answer_tokens": 8, "rounds": 1, "pause": 2.0, "output_lines": 0, "mlp_multiplier": 1, "extra_layers": 0}


# -- the conversation -------------------------------------------------------------------------


def first_question(conversation: int) -> str:
    """What conversation `conversation` opens with: one agent, several tasks, so the conversations
    share the system prompt and differ right after it."""
    return f"Task {conversation}: what is failing?"


def tool_pause(mean: float, rnd: int, conversation: int, turn: int) -> float:
    """Seconds the agent's tool runs before turn `turn`: uniform on 0 to twice `mean`, the same in
    both policies' runs of a round. Without pauses, or with pauses short next to a turn, four
    conversations at full width keep their workers by themselves under any policy (a turn takes
    the slot its previous turn just freed: first-free kept 8 of 8 at 0.3 s in a first version of
    this script); with pauses of seconds, as an agent's tools take, workers go idle between turns
    and first-free sends the next turn to the first idle one in config order (15 of 24 kept at
    2 s, docs/proxy.md)."""
    if turn == 1 or mean <= 0:
        return 0.0
    return random.Random(f"{rnd}-{conversation}-{turn}").uniform(0, 2 * mean)


def tool_output(conversation: int, turn: int, lines: int) -> str:
    """What the agent's tool printed before turn `turn`: `lines` lines of its own, as a test run or a
    file read would, so a conversation's tail grows past the system prompt it shares with others."""
    return "\n".join(f"src/task{conversation}/module_{turn}_{k}.py:{7 * k + turn}: assert parse(case_{conversation}_{k}) == {k * turn}"
                     for k in range(lines))


def messages_for(system: str, conversation: int, answers: list[str], output_lines: int = 0) -> list[dict]:
    """The messages of the next turn: agent_bench's conversation (each answer appended as the
    assistant turn, then its next follow-up), opened by this conversation's own question; each
    follow-up after `output_lines` lines of tool output when asked for."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first_question(conversation)}]
    for i, answer in enumerate(answers):
        follow_up = FOLLOW_UPS[i % len(FOLLOW_UPS)]
        if output_lines:
            follow_up = f"{tool_output(conversation, i + 2, output_lines)}\n\n{follow_up}"
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    return messages


# -- pure summaries (unit-tested) -----------------------------------------------------------


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    s = stats.summarize(values)
    return {"median": s.median, "mad": s.mad, "min": s.min, "max": s.max, "n": s.n}


def stayed(rows: list[dict]) -> list[bool]:
    """For each turn 2+ with both ends known: did the worker of the conversation's previous turn serve it?"""
    by_conv: dict[tuple, dict[int, str | None]] = {}
    for r in rows:
        by_conv.setdefault((r["run"], r["conversation"]), {})[r["turn"]] = r.get("worker")
    out = []
    for turns in by_conv.values():
        for t, worker in sorted(turns.items()):
            prev = turns.get(t - 1)
            if t >= 2 and worker is not None and prev is not None:
                out.append(worker == prev)
    return out


def summarize_policy(rows: list[dict], runs: list[dict]) -> dict:
    later = [r["ttft_s"] for r in rows if r["turn"] >= 2]
    kept = stayed(rows)
    decisions: dict[str, int] = {}
    for r in rows:
        if r.get("routing"):
            decisions[r["routing"]] = decisions.get(r["routing"], 0) + 1
    later_rows = [r for r in rows if r["turn"] >= 2 and r.get("prompt_tokens")]
    prompt_later = sum(r["prompt_tokens"] for r in later_rows)
    cached_later = sum(r.get("cached_tokens") or 0 for r in later_rows)
    lookups = sum(run["prefix_cache"]["lookups"] for run in runs if run.get("prefix_cache"))
    hits = sum(run["prefix_cache"]["hits"] for run in runs if run.get("prefix_cache"))
    return {
        "ttft_turn1_s": spread([r["ttft_s"] for r in rows if r["turn"] == 1]),
        "ttft_later_s": spread(later),
        "ttft_later_per_run_s": [stats.median([r["ttft_s"] for r in rows if r["turn"] >= 2 and r["run"] == run["run"]])
                                 for run in runs if any(r["turn"] >= 2 and r["run"] == run["run"] for r in rows)],
        "prompt_tokens": spread([r["prompt_tokens"] for r in rows if r.get("prompt_tokens")]),
        "affinity_hit_rate": (sum(kept) / len(kept)) if kept else None,
        "affinity_hits": [sum(kept), len(kept)],
        "decisions": decisions,
        "cached_share_later": (cached_later / prompt_later) if prompt_later else None,
        "cached_tokens_later": [cached_later, prompt_later],
        "prefix_cache_hit_rate": (hits / lookups) if lookups else None,
        "prefix_cache": [hits, lookups] if any(run.get("prefix_cache") for run in runs) else None,
    }


def compare(summary: dict) -> dict | None:
    """Turns 2+ under first-free over affinity, per-run medians as the passes: above 1, affinity answers sooner."""
    a = summary.get("affinity", {}).get("ttft_later_per_run_s") or []
    f = summary.get("first-free", {}).get("ttft_later_per_run_s") or []
    if not a or not f:
        return None
    v = stats.decide(a, f)
    return {"decision": v.decision, "ratio": v.ratio, "lo": v.lo, "hi": v.hi, "n": [v.n_base, v.n_cand]}


def _span(s: dict | None, scale: float = 1.0, digits: int = 2, unit: str = " s") -> str:
    if not s:
        return "n/a"
    f = lambda v: f"{v * scale:.{digits}f}"  # noqa: E731
    return f"{f(s['median'])}{unit} ({f(s['min'])}-{f(s['max'])}, n={s['n']})"


def _rate(rate: float | None, counts: list | None) -> str:
    if rate is None or not counts:
        return "-"
    return f"{rate * 100:.0f}% ({counts[0]:g} of {counts[1]:g})"


def format_lines(report: dict) -> list[str]:
    """The table a person reads: one block per policy, then the comparison (never a lone ratio)."""
    m = report["meta"]
    lines = [f"{m['conversations']} conversations x {m['turns']} turns through the proxy, {m['workers']} workers of width "
             f"{m['width']}, {m['answer_tokens']} answer tokens, tool pauses {m['pause']:g} s on average"
             + (f" and {m['output_lines']} lines of tool output" if m.get("output_lines") else "") + ", "
             f"{m['rounds']} round(s) per policy, alternated"]
    for policy, s in report["summary"]["policies"].items():
        lines.append(f"{policy}:")
        lines.append(f"  TTFT turns 2+   {_span(s['ttft_later_s'])}")
        lines.append(f"  TTFT turn 1     {_span(s['ttft_turn1_s'])}")
        lines.append(f"  prompt tokens   {_span(s['prompt_tokens'], digits=0, unit='')}")
        lines.append(f"  affinity hits   {_rate(s['affinity_hit_rate'], s['affinity_hits'])} of turns 2+ on the previous turn's worker")
        lines.append(f"  cached tokens   {_rate(s['cached_share_later'], s['cached_tokens_later'])} of turns 2+'s prompt tokens")
        decisions = ", ".join(f"{k} {v}" for k, v in sorted(s["decisions"].items())) or "-"
        lines.append(f"  routing         {decisions}")
        lines.append(f"  prefix cache    {_rate(s['prefix_cache_hit_rate'], s['prefix_cache'])}"
                     + ("" if s["prefix_cache"] else " (the workers export no prefix-cache series)"))
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
    for note in report["summary"].get("notes", []):
        lines.append(f"note: {note}")
    return lines


def policy_order(round_index: int) -> tuple[str, ...]:
    """Alternated, the order rotating each round, so a drift in the machine's load hits both alike."""
    return POLICIES if round_index % 2 == 0 else POLICIES[::-1]


# -- models and processes ---------------------------------------------------------------------


async def stream_turn(session, url: str, messages: list[dict], answer_tokens: int, rid: str) -> dict:
    r = await stream_chat(session, url, "bench", messages, answer_tokens, headers={"X-Request-Id": rid})
    return {"ttft_s": r["ttft_s"], "text": r["text"], "prompt_tokens": r["usage"].get("prompt_tokens"),
            "cached_tokens": (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")}


async def converse(session, url: str, run: int, rnd: int, conversation: int, system: str, sizes: dict) -> list[dict]:
    rows, answers = [], []
    for turn in range(1, sizes["turns"] + 1):
        await asyncio.sleep(tool_pause(sizes["pause"], rnd, conversation, turn))
        rid = f"routing-bench-{run}-{conversation}-{turn}"
        r = await stream_turn(session, url, messages_for(system, conversation, answers, sizes["output_lines"]), sizes["answer_tokens"], rid)
        answers.append(r.pop("text") or "(no answer)")
        rows.append({"run": run, "conversation": conversation, "turn": turn, "request_id": rid, **r})
    return rows


async def prefix_cache_counts(session, workers) -> dict | None:
    from mtpstack import series
    from mtpstack.proxy.prometheus import parse_samples, sample

    hits = lookups = 0.0
    found = False
    for w in workers:
        async with session.get(w.url + "/metrics") as resp:
            samples = parse_samples(await resp.text())
        n = sample(samples, series.PREFIX_CACHE_LOOKUPS)
        if n is not None:
            found = True
            lookups += n
            hits += sample(samples, series.PREFIX_CACHE_HITS) or 0.0
    return {"hits": hits, "lookups": lookups} if found else None


async def one_run(run: int, rnd: int, policy: str, args, sizes: dict, target: Path, head: Path, workdir: Path) -> tuple[list[dict], dict]:
    import aiohttp

    from mtpstack.runtime import free_port

    ports = {f"w{i}": free_port() for i in range(WORKERS)}
    data = fleet(policy, target, head, args.width, args.depth, ports, free_port())
    rundir = workdir / f"run{run}-{policy}"
    procs, proxy, workers = await asyncio.to_thread(start_fleet, data, rundir)
    system = system_prompt(rnd, sizes["tools"])  # both policies of a round get the same conversations
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as session:
            for w in workers:  # the first forward of a fresh process compiles; discarded
                await stream_turn(session, w.url, [{"role": "user", "content": "warm up"}], 2, f"warmup-{run}-{w.name}")
            started = time.perf_counter()
            per_conv = await asyncio.gather(*(converse(session, proxy.url, run, rnd, c, system, sizes) for c in range(CONVERSATIONS)))
            wall = time.perf_counter() - started
            cache = await prefix_cache_counts(session, workers)
    finally:
        procs.stop_all()
    logged = request_lines((rundir / "proxy.log").read_text(errors="replace"))
    rows = []
    for conv_rows in per_conv:
        for r in conv_rows:
            line = logged.get(r["request_id"], {})
            rows.append({**r, "policy": policy, "worker": line.get("worker"), "routing": line.get("routing")})
    return rows, {"run": run, "policy": policy, "wall_s": wall, "prefix_cache": cache}


async def run_all(args, sizes: dict) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="routing-bench-"))
    target, head, source = await asyncio.to_thread(demo_pair, workdir, sizes["mlp_multiplier"], sizes["extra_layers"], CONTEXT)
    print(f"models: {source}\n  target {target}\n  head {head}", file=sys.stderr)
    rows: list[dict] = []
    runs: list[dict] = []
    run = 0
    for rnd in range(sizes["rounds"]):
        for policy in policy_order(rnd):
            r, info = await one_run(run, rnd, policy, args, sizes, target, head, workdir)
            rows += r
            runs.append(info)
            print(f"round {rnd + 1}/{sizes['rounds']}: {policy} done in {info['wall_s']:.1f} s", file=sys.stderr)
            run += 1
    policies = {p: summarize_policy([r for r in rows if r["policy"] == p], [x for x in runs if x["policy"] == p]) for p in POLICIES}
    summary = {"policies": policies}
    summary["comparison"] = compare(policies)
    notes = []
    if not any(p["prefix_cache"] for p in policies.values()):
        notes.append("the workers export no prefix cache: routing cannot shorten a turn yet, only move it")
    if sizes["rounds"] < stats.MIN_PASSES:
        notes.append(f"{sizes['rounds']} round(s): figures, not a verdict; rerun with --rounds {stats.MIN_PASSES} or more")
    summary["notes"] = notes
    import mlx.core as mx

    return {
        "meta": {
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "models": source, "target": str(target), "head": str(head),
            "conversations": CONVERSATIONS, "workers": WORKERS, "width": args.width, "depth": args.depth, **sizes,
            "machine": platform.machine(), "cpus": os.cpu_count(), "ld_preload": os.environ.get("LD_PRELOAD"),
            "versions": {"mlx": mx.__version__}, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "summary": summary,
        "runs": runs,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    from mtpstack.validator import DEPTH_DEFAULT

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small, short run: the target not widened, 12 tools, 3 turns, 1 round")
    p.add_argument("--rounds", type=int, help=f"runs per policy (default: {FULL['rounds']}, --quick {QUICK['rounds']})")
    p.add_argument("--turns", type=int, help=f"turns per conversation (default: {FULL['turns']}, --quick {QUICK['turns']})")
    p.add_argument("--tools", type=int, help=f"tool lines in the system prompt (default: {FULL['tools']}, --quick {QUICK['tools']})")
    p.add_argument("--pause", type=float, help=f"mean seconds a tool runs between turns (default: {FULL['pause']}, --quick {QUICK['pause']})")
    p.add_argument("--output-lines", type=int, help="lines of tool output before each follow-up (default: 0, the agent bench's "
                   "conversation; 20 adds about 800 tokens a turn with the demo tokenizer, which a moved turn prefills again)")
    p.add_argument("--answer-tokens", type=int, help=f"greedy tokens per answer (default: {FULL['answer_tokens']})")
    p.add_argument("--width", type=int, default=2, help="each worker's maxNumSeqs and gate (default: 2)")
    p.add_argument("--depth", type=int, default=DEPTH_DEFAULT, help=f"draft depth (default: {DEPTH_DEFAULT})")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    args = p.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    for key in ("rounds", "turns", "tools", "answer_tokens", "pause", "output_lines"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    if min(sizes["rounds"], sizes["turns"], sizes["answer_tokens"]) < 1 or min(sizes["tools"], sizes["pause"], sizes["output_lines"]) < 0:
        p.error("--rounds, --turns and --answer-tokens must be at least 1, --tools, --pause and --output-lines at least 0")
    report = asyncio.run(run_all(args, sizes))
    return emit(report, format_lines(report), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
