"""Agent benchmark: what the prefix cache saves an agent, beside mlx_lm.server's prompt cache, and Claude Code's turns.

`native+mtp` (the native worker, the MTP head, its prefix cache at the default budget) and `mlx_lm.server`
(its prompt cache), started once and used alternately, each round on a fresh coding agent's system prompt:
  1. `turns`: a 6-turn conversation fed its greedy answers, TTFT per turn, the template's thinking off and on;
  2. `shared`: a second conversation on the same system prompt, its first turn against the first's;
  3. `concurrent`: 4 clients at once with distinct prompts (no cache hits), median TTFT;
  4. `prefill_itl` (native only): one streaming row's gaps while a 2,000-token prompt is prefilled beside it.
On native workers of their own, started afresh:
  5. `restart`: a first turn on a worker with a disk tier, the next turn after a restart on its directory,
     against a fresh worker's whole prefill (both TTFTs, the restore's GB/s, the first turn's writes);
  6. `memory`: `--flood` distinct prompts into one worker of the shipped demo pair: VmRSS and VmHWM against
     `mtpstack_worker_prefix_cache_bytes` after each;
  7. `spill_itl`: a row's gaps while prompts pass a small budget (`SPILL_GIB`), memory only and with a disk tier;
  8. `restore_itl`: the row's gaps while a prompt on disk only is restored beside it, against those outside.
Only when named, on `mtpstack up`'s demo fleet as shipped, fresh each round:
  9. `claude_code`: Claude Code headless (`claude -p`; `scripts/bootstrap-npm`, or `--claude`), `CLAUDE_TURNS`,
     through a relay timing each `/v1/messages` to its first content block, with `message_start`'s usage, a
     request after a tool's result its own row; `--first-party`: its first-party mode, the billing fields that
     changed per request named.

    python bench/scripts/agent_bench.py --out bench-agent.json        # the demo pair, target widened to ~70M
    python bench/scripts/agent_bench.py --quick                        # the shipped demo as it is, 1 round
    python bench/scripts/agent_bench.py --only memory restore_itl --baseline /tmp/base/.venv/bin/mtpstack
    flock /work/bench.lock python bench/scripts/agent_bench.py --only claude_code --rounds 3 --warmup 0

Raw samples and summaries go to stdout (or --out) as JSON; a readable table to stderr.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path

import aiohttp
from aiohttp import web

from mtpstack import series
from mtpstack.bench.conversations import REQUEST_TIMEOUT, answered, run_sessions
from mtpstack.bench.load import memory_kib
from mtpstack.bench.parts import demo_pair, emit, ensure_preload, fmt, loadavg, post_json, rotated, rounds, spread
from mtpstack.bench.servers import (metrics, served_model, start_servers, start_workers, stream_chat, worker_command,
                                    worker_profile)
from mtpstack.bench.stats import percentile
from mtpstack.bench.workloads import ANSWER_TOKENS, CONTEXT, FOLLOW_UPS, TURNS, conversation, opening, system_prompt
from mtpstack.proxy.prometheus import sample
from mtpstack.runtime import Process, StartError, free_port, url_of

SERVERS = ["native+mtp", "mlx_lm.server"]
SCENARIOS = ["turns", "shared", "concurrent", "prefill_itl", "restart", "memory", "spill_itl", "restore_itl",
             "claude_code"]
#: The scenarios that start servers of their own rather than use the two.
OWN_WORKERS = {"restart", "memory", "spill_itl", "restore_itl", "claude_code"}
#: The draft depth of every native worker; the demo target widened by (MLP multiplier, zero layers): ~70M parameters.
DEPTH, WIDEN = 3, (8, 10)
#: `spill_itl`: the memory budget both workers get, small enough that the flood spills past it; the prompts sent.
SPILL_GIB, SPILL_PROMPTS = 0.01, 4
#: `restore_itl`: restores from disk beside the row; `memory`: tokens per prompt of the flood.
RESTORES, FLOOD_TOKENS = 4, 8192
#: What a worker's disk tier logs when it stops (`prefix_disk.DiskTier.close`): writes, MB, seconds, sync seconds.
TIER_STOPS = re.compile(r"the disk tier stops: (\d+) writes, ([\d.]+) MB in ([\d.]+) s, ([\d.]+) s of it syncing")
#: `turns`: the template's `enable_thinking`, each mode a conversation of its own (the first also the top-level row).
THINKING = {"off": False, "on": True}
#: A server's rows of the table: (label, key, what its ratio is over, the ratio's key).
SERVER_ROWS = [("turn 1 TTFT", "turn1_ttft_s", None, None),
               ("turns 2+ TTFT", "later_ttft_s", "own turn 1", "later_over_turn1"),
               ("shared-system TTFT", "shared_ttft_s", "first conversation", "shared_over_first"),
               ("4-client TTFT", "concurrent_ttft_s", None, None)]
CLAUDE = _checkout.ROOT / ".claude-code" / "node_modules" / ".bin" / "claude"
#: `claude_code`'s turns of a round, in order: (label, prompt, continue the conversation, folder).
CLAUDE_TURNS = [("first", "list the files", False, "a"), ("next 1", "and the tests?", True, "a"),
                ("next 2", "thanks", True, "a"), ("new conversation", "list the files", False, "b")]
#: Claude Code's own switch for its first-party mode (it otherwise checks the base URL for `api.anthropic.com`).
FIRST_PARTY_ENV = {"_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL": "1"}
#: The label of a turn's request after the tool's result.
AFTER_RESULT = "{}, after the tool's result"


def ratio(a, b):
    return a / b if a and b else None


# -- pure summaries (unit-testable) ------------------------------------------------------


def spreads(rows: list[dict], keys: tuple[str, ...]) -> dict:
    return {k: spread([r[k] for r in rows if r.get(k) is not None]) for k in keys}


def summarize_samples(samples: dict) -> dict:
    out: dict = {}
    for server, s in samples.items():
        if server in OWN_WORKERS:
            continue
        out[server] = {
            **turns_summary(s.get("turns", [])),
            "thinking": {mode: turns_summary(convs) for mode, convs in (s.get("turns_by_thinking") or {}).items()},
            "shared_ttft_s": spread([x for x, _ in s.get("shared", [])]),
            "shared_over_first": spread([x / f for x, f in s.get("shared", []) if f]),
            "concurrent_ttft_s": spread(s.get("concurrent", [])),
        }
        if windows := s.get("prefill_itl"):
            out[server]["prefill_itl"] = {
                **spreads(windows, ("median_s", "p99_s", "outside_median_s")),
                "p99_over_median": spread([w["p99_s"] / w["median_s"] for w in windows if w["median_s"]]),
            }
    return out


def turns_summary(turns: list[list[float]]) -> dict:
    most = max(map(len, turns), default=0)
    return {
        "turn1_ttft_s": spread([conv[0] for conv in turns if conv]),
        "later_ttft_s": spread([t for conv in turns for t in conv[1:]]),
        "later_over_turn1": spread([statistics.median(c[1:]) / c[0] for c in turns if len(c) > 1 and c[0]]),
        "per_turn_ttft_s": [spread([c[i] for c in turns if len(c) > i]) for i in range(most)],
    }


def restart_summary(rounds: list[dict]) -> dict:
    restored, wrote = [r for r in rounds if r.get("restore_s")], [r for r in rounds if r.get("write_s")]
    return {
        **spreads(rounds, ("restart_ttft_s", "cold_ttft_s", "cached_tokens", "prompt_tokens")),
        "restart_over_cold": spread([r["restart_ttft_s"] / r["cold_ttft_s"] for r in rounds if r["cold_ttft_s"]]),
        "restore_s": spread([r["restore_s"] for r in restored]),
        "restore_gb_s": spread([r["read_bytes"] / r["restore_s"] / 1e9 for r in restored if r.get("read_bytes")]),
        **spreads(wrote, ("write_s", "sync_s", "written_mb")),
        "sync_share": spread([r["sync_s"] / r["write_s"] for r in wrote]),
    }


def memory_summary(floods: list[dict]) -> dict:
    """Per flood: resident memory's growth from the idle worker against what the cache counts."""
    out = {}
    for f in floods:
        after, base = f["after"], f["idle_rss_mib"]
        out[f["build"]] = {
            "prompts": len(after),
            "rss_growth_mib": [round(a["rss_mib"] - base, 1) for a in after],
            "peak_growth_mib": [round(a["hwm_mib"] - base, 1) for a in after],
            "gauge_mib": [round(a["gauge_mib"], 1) for a in after],
            "growth_per_prompt_mib": spread([b["rss_mib"] - a["rss_mib"] for a, b in zip(after, after[1:])]),
            "growth_over_gauge": ratio(after[-1]["rss_mib"] - base, after[-1]["gauge_mib"]) if after else None,
        }
    return out


def by_variant(rounds: list[dict], keys: tuple[str, ...]) -> dict:
    return {v: spreads([r[v] for r in rounds], keys) for v in (rounds[0] if rounds else [])}


def restore_summary(rounds: list[dict]) -> dict:
    out = by_variant(rounds, ("median_s", "p99_s", "max_s", "outside_median_s", "disk_hits", "read_mb", "restore_s"))
    for build, v in out.items():
        v["inside_over_outside"] = spread([r[build]["median_s"] / r[build]["outside_median_s"] for r in rounds
                                           if r[build].get("median_s") and r[build].get("outside_median_s")])
    return out


def spill_summary(rounds: list[dict]) -> dict:
    ratios = [r["disk"]["p99_s"] / r["memory"]["p99_s"] for r in rounds if r["disk"]["p99_s"] and r["memory"]["p99_s"]]
    return {**by_variant(rounds, ("median_s", "p99_s", "disk_writes")), "p99_disk_over_memory": spread(ratios)}


def measured(v: dict | None) -> bool:
    return bool(v) and any(v[k]["n"] for k in ("turn1_ttft_s", "shared_ttft_s", "concurrent_ttft_s"))


def secs(s: dict) -> str:
    return fmt(s, " s", 3)


def format_lines(report: dict) -> list[str]:
    s = report["summary"]
    lines = []
    if any(measured(s.get(name)) for name in SERVERS):
        lines.append(f"{report['rounds']} rounds (+{report['warmup']} warm-up discarded), {TURNS} turns, prompts "
                     f"{report.get('prompt_tokens') or '?'} tokens, servers alternated")
    for server, v in s.items():
        if server in OWN_WORKERS or not measured(v):
            continue
        lines.append(f"{server}")
        for label, key, over, ratio_key in SERVER_ROWS:
            over_cell = f"   (/ {over}: {fmt(v[ratio_key], 'x', 3)})" if over else ""
            lines.append(f"  {label:<18} {secs(v[key])}{over_cell}")
        lines += [f"  thinking {mode:<3}: turn 1 {secs(t['turn1_ttft_s'])}, turns 2+ {secs(t['later_ttft_s'])}"
                  f" (/ own turn 1: {fmt(t['later_over_turn1'], 'x', 3)})" for mode, t in v.get("thinking", {}).items()]
        if p := v.get("prefill_itl"):
            lines.append(f"  ITL beside a 2,000-token prefill: median {secs(p['median_s'])}, p99 {secs(p['p99_s'])}, "
                         f"p99/median {fmt(p['p99_over_median'], 'x', 2)}; "
                         f"outside it median {secs(p['outside_median_s'])}")
    a, b = s.get(SERVERS[0]), s.get(SERVERS[1])
    if b and measured(a):
        pairs = [(name, a[key], b[key]) for name, key, *_ in SERVER_ROWS[1:]]
        pairs += [(f"turns 2+ TTFT, thinking {mode}", t["later_ttft_s"],
                   b["thinking"].get(mode, {}).get("later_ttft_s"))
                  for mode, t in a["thinking"].items()]
        for name, mine, theirs in pairs:
            r = ratio(mine["median"], (theirs or {}).get("median"))
            lines.append(f"{name}: {SERVERS[0]} / {SERVERS[1]} = {r:.2f}x" if r else f"{name}: n/a")
    if r := s.get("restart"):
        lines.append(f"restart ({fmt(r['prompt_tokens'], '', 0)} tokens, {fmt(r['cached_tokens'], '', 0)} from disk): "
                     f"next turn {secs(r['restart_ttft_s'])} against {secs(r['cold_ttft_s'])} prefilled whole: "
                     f"{fmt(r['restart_over_cold'], 'x', 3)}; restore {secs(r['restore_s'])} at "
                     f"{fmt(r['restore_gb_s'], ' GB/s', 2)}")
        if r.get("write_s", {}).get("n"):
            lines.append(f"  the first turn's writes ({fmt(r['written_mb'], ' MB', 1)}): {secs(r['write_s'])}, "
                         f"of it syncing {secs(r['sync_s'])}: {fmt(r['sync_share'], '', 2)} of the write time")
    if sp := s.get("spill_itl"):
        lines += [f"a row's gaps beside a spilling flood, {v}: median {secs(sp[v]['median_s'])}, "
                  f"p99 {secs(sp[v]['p99_s'])} ({fmt(sp[v]['disk_writes'], '', 0)} disk writes)"
                  for v in ("memory", "disk")]
        lines.append(f"  p99 with the disk tier / memory only: {fmt(sp['p99_disk_over_memory'], 'x', 2)}")
    for build, r in s.get("restore_itl", {}).items():
        lines.append(f"a row's gaps beside a restore from disk, {build} ({fmt(r['read_mb'], ' MB', 1)} a restore in "
                     f"{secs(r['restore_s'])}): median {secs(r['median_s'])}, max {secs(r['max_s'])}; "
                     f"outside the restores median {secs(r['outside_median_s'])}: "
                     f"{fmt(r['inside_over_outside'], 'x', 2)}")
    for build, m in s.get("memory", {}).items():
        over = f"{m['growth_over_gauge']:.2f}x" if m["growth_over_gauge"] else "n/a"
        lines.append(f"memory, {build}: after {m['prompts']} prompts resident +{m['rss_growth_mib'][-1]:.0f} MiB "
                     f"(peak +{m['peak_growth_mib'][-1]:.0f}), the cache counts {m['gauge_mib'][-1]:.0f} MiB: {over}; "
                     f"per prompt {fmt(m['growth_per_prompt_mib'], ' MiB', 1)}")
    return lines + (claude_lines(s["claude_code"]) if "claude_code" in s else [])


def itl_windows(times: list[float], windows: list[tuple[float, float]]) -> dict:
    """The gaps between chunk `times` that end inside any of `windows`, and those outside."""
    gaps = [(b - a, any(s <= b <= e for s, e in windows)) for a, b in zip(times, times[1:])]
    inside, outside = [g for g, within in gaps if within], [g for g, within in gaps if not within]
    if not inside:
        return {"median_s": None, "p99_s": None, "n": 0}
    return {"median_s": statistics.median(inside), "p99_s": percentile(inside, 99), "max_s": max(inside),
            "n": len(inside), "outside_median_s": statistics.median(outside) if outside else None}


def tier_writes(log_path: Path) -> dict:
    """A stopped worker's disk-tier writes, from its tier's last stop line ({}: none)."""
    found = list(TIER_STOPS.finditer(log_path.read_text(errors="replace"))) if log_path.exists() else []
    if not found:
        return {}
    writes, mb, seconds, sync = found[-1].groups()
    return {"writes": int(writes), "written_mb": float(mb), "write_s": float(seconds), "sync_s": float(sync)}


# -- measurement on the two servers -----------------------------------------------------


async def conversation_turns(url, model, system: str, thinking: bool, tag: str) -> tuple[list[float], list[int]]:
    """Each turn's TTFT and prompt tokens."""
    extra = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": thinking}}
    sessions = [conversation(0, system, "what is failing?", TURNS)]
    rows = answered(await run_sessions(url + "/v1", model, sessions, ANSWER_TOKENS, labels={}, tag=tag, extra=extra))
    return [r["ttft_s"] for r in rows], [r["prompt_tokens"] for r in rows]


async def shared(session, url, model, seed: int, tools: int) -> tuple[float, float]:
    system = system_prompt(100 + seed, tools)
    first = await stream_chat(session, url, model, opening(system), 8)
    other = await stream_chat(session, url, model, opening(system, "which file is largest?"), 8)
    return other["ttft_s"], first["ttft_s"]


async def concurrent(session, url, model, seed: int, tools: int) -> float:
    prompts = [f"client {c}. " + system_prompt((200 + seed) * 10 + c, tools // 4) for c in range(4)]
    runs = await asyncio.gather(*(stream_chat(session, url, model, [{"role": "user", "content": p}], 16)
                                  for p in prompts))
    return statistics.median(r["ttft_s"] for r in runs)


async def prefill_itl(session, url, model, seed: int, tools: int) -> dict:
    times: list[float] = []
    decoding = await decoding_row(session, url, model, f"round {seed}", times, 400, ignore_eos=False)
    prompt = [{"role": "user", "content": system_prompt(1000 + seed, tools)}]
    long = await stream_chat(session, url, model, prompt, 4)
    await decoding
    return itl_windows(times, [(long["sent"], long["first"])])


#: The scenarios on the two servers past `turns`, each one measurement a round (`prefill_itl` native only).
ON_SERVERS = {"shared": shared, "concurrent": concurrent, "prefill_itl": prefill_itl}


async def decoding_row(session, url: str, model: str, label: str, times: list, tokens: int = 4000,
                       ignore_eos: bool = True) -> asyncio.Task:
    """A streaming plain completion (its chunks' times in `times`), returned once it has decoded 20 tokens."""
    decoding = asyncio.create_task(stream_chat(session, url, model, f"# {label}\nimport os\n", tokens, times,
                                               ignore_eos=ignore_eos))
    while len(times) < 20:
        if decoding.done():  # failed, or the model ended its answer: no decoding row to measure beside
            await decoding
            raise RuntimeError(f"{url}: the decoding row ended after {len(times)} tokens")
        await asyncio.sleep(0.01)
    return decoding


@asynccontextmanager
async def beside_a_row(session, url: str, label: str):
    """A decoding row's chunk times while the block runs, the row cancelled after."""
    times: list[float] = []
    decoding = await decoding_row(session, url, "bench", label, times)
    try:
        yield times
    finally:
        decoding.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await decoding


async def shared_servers(session, args, target: Path, head: Path, workdir: Path, on: set, samples: dict) -> str | None:
    """The scenarios on the two servers; the turns' prompt sizes."""
    servers, prompt_tokens = start_servers(target, head, DEPTH, workdir, SERVERS), None
    try:
        for rnd, keep in rounds(args.warmup, args.rounds):
            for name in rotated(SERVERS, rnd):
                url, model, got = servers[name].url, served_model(name, target), samples[name]
                seed = rnd * 2 + SERVERS.index(name)  # every server and round its own system prompt
                by_mode = {mode: await conversation_turns(url, model, system_prompt(seed * 10 + m, args.tools),
                                                          thinking, f"agent-{rnd}-{name}-{mode}")
                           for m, (mode, thinking) in enumerate(THINKING.items())} if "turns" in on else {}
                ttfts, tokens = by_mode.get("off", ([], []))
                now = {key: await measure(session, url, model, seed, args.tools) for key, measure in ON_SERVERS.items()
                       if key in on and (key != "prefill_itl" or name == "native+mtp")}
                print(f"round {rnd} {name}: turns {[round(t, 3) for t in ttfts]} {now}", file=sys.stderr)
                if keep:
                    for key, value in {"turns": ttfts, **now}.items():
                        if value and (key != "prefill_itl" or value["n"]):
                            got[key].append(value)
                    for mode, (t, _) in by_mode.items():
                        got["turns_by_thinking"].setdefault(mode, []).append(t)
                if tokens:
                    prompt_tokens = prompt_tokens or f"{tokens[0]}-{tokens[-1]}"
    finally:
        for proc in servers.values():
            proc.stop()
    return prompt_tokens


# -- scenarios with workers of their own ------------------------------------------------


@contextmanager
def native_worker(target: Path, head: Path, logdir: Path, name: str, *, program: str | None = None,
                  cache_dir: Path | None = None, cache_gib: float | None = None):
    """A native worker of 2 rows with the MTP head, run by `program` (another build's `mtpstack`), stopped after."""
    port = free_port()
    cache = {"dir": str(cache_dir) if cache_dir else None, **({"maxGiB": cache_gib} if cache_gib is not None else {})}
    argv = worker_command(worker_profile(target, head, DEPTH, port, width=2, prefixCache=cache), program)
    w = start_workers({name: (argv, port)}, logdir)[name]
    try:
        yield w
    finally:
        w.stop()


def counters(url: str, names: list[str]) -> dict[str, float]:
    """The counters `names`, 0 for one not exported."""
    samples = metrics(url)
    return {name: sample(samples, name) or 0.0 for name in names}


async def scrape(url: str, names: list[str]) -> dict[str, float]:
    """`counters` off the event loop, so a decoding row timed beside the scrape is not held up by it."""
    return await asyncio.to_thread(counters, url, names)


def builds(args) -> dict[str, str | None]:
    return {"this checkout": None, **({"baseline": args.baseline} if args.baseline else {})}


async def restart_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """A first turn, a restart on the disk tier and the next turn; that turn again on a fresh worker, cold."""
    names = [series.PREFIX_CACHE_DISK_READ_BYTES, series.PREFIX_CACHE_DISK_RESTORE_SECONDS + "_sum"]
    cache = workdir / f"restart-cache-{rnd}"
    messages = opening(system_prompt(500 + rnd, args.tools))
    with native_worker(target, head, workdir, f"restart-{rnd}-a", cache_dir=cache) as w:
        first = await stream_chat(session, w.url, "bench", messages, ANSWER_TOKENS)
    writes = tier_writes(w.log_path)
    messages = messages + [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": FOLLOW_UPS[0]}]

    async def next_turn(label: str, cache: Path) -> dict:
        with native_worker(target, head, workdir, f"restart-{rnd}-{label}", cache_dir=cache) as w:
            before = await scrape(w.url, names)
            r = await stream_chat(session, w.url, "bench", messages, ANSWER_TOKENS)
            return {**r, **{k: v - before[k] for k, v in (await scrape(w.url, names)).items()}}

    turns = {"b": cache, "cold": workdir / f"cold-cache-{rnd}"}
    got = {label: await next_turn(label, turns[label]) for label in rotated(list(turns), rnd)}
    hot, usage = got["b"], got["b"]["usage"]
    return {"restart_ttft_s": hot["ttft_s"], "cold_ttft_s": got["cold"]["ttft_s"], "read_bytes": hot[names[0]],
            "restore_s": hot[names[1]], **writes, "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


async def restore_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """A row's gaps beside `RESTORES` restores, per build, each on a copy of one primed directory."""
    names = [series.PREFIX_CACHE_DISK_HITS, series.PREFIX_CACHE_DISK_READ_BYTES,
             series.PREFIX_CACHE_DISK_RESTORE_SECONDS + "_sum"]
    messages = opening(system_prompt(900 + rnd, args.tools))
    primed = workdir / f"restore-primed-{rnd}"
    with native_worker(target, head, workdir, f"restore-{rnd}-prime", cache_gib=SPILL_GIB, cache_dir=primed) as w:
        await stream_chat(session, w.url, "bench", messages, 1)  # stopped after: the snapshots are on disk
    programs, out = builds(args), {}
    for b, build in enumerate(rotated(list(programs), rnd)):
        cache = Path(shutil.copytree(primed, workdir / f"restore-{rnd}-{b}"))
        with native_worker(target, head, workdir, f"restore-{rnd}-{b}", program=programs[build],
                           cache_gib=SPILL_GIB, cache_dir=cache) as w:
            async with beside_a_row(session, w.url, f"restore {rnd}") as times:
                before, windows = await scrape(w.url, names), []
                for _ in range(RESTORES):
                    r = await stream_chat(session, w.url, "bench", messages, 1)
                    windows.append((r["sent"], r["first"]))
                after = await scrape(w.url, names)
            hits, read, seconds = (after[k] - before[k] for k in names)
        out[build] = {**itl_windows(times, windows), "disk_hits": hits, "read_mb": read / 1e6 / max(hits, 1),
                      "restore_s": seconds / max(hits, 1)}
    return out


async def spill_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    out = {}
    for variant in rotated(["memory", "disk"], rnd):
        with native_worker(target, head, workdir, f"spill-{rnd}-{variant}", cache_gib=SPILL_GIB,
                           cache_dir=workdir / f"spill-cache-{rnd}" if variant == "disk" else None) as w:
            async with beside_a_row(session, w.url, f"spill {rnd}") as times:
                start = time.perf_counter()
                for i in range(SPILL_PROMPTS):
                    prompt = system_prompt(700 + rnd * 50 + i, args.tools // 2)
                    await stream_chat(session, w.url, "bench", [{"role": "user", "content": prompt}], 1)
                end = time.perf_counter()
            writes = await scrape(w.url, [series.PREFIX_CACHE_DISK_WRITES, series.PREFIX_CACHE_EVICTIONS])
        out[variant] = {**itl_windows(times, [(start, end)]), "disk_writes": writes[series.PREFIX_CACHE_DISK_WRITES],
                        "evictions": writes[series.PREFIX_CACHE_EVICTIONS]}
    return out


def memory_flood(head: Path, args, workdir: Path, build: str, program: str | None) -> dict:
    """Resident memory and the cache's gauge after each prompt of the flood, on the shipped demo pair."""
    from mtpstack.worker.demo import DEMO_TARGET

    rng, after = random.Random(11), []
    with native_worker(Path(DEMO_TARGET), head, workdir, f"memory-{build}", program=program) as w:
        idle = memory_kib(w.pid)["VmRSS"] / 1024
        for i in range(args.flood):
            prompt = [rng.randrange(3, 1000) for _ in range(FLOOD_TOKENS)]
            post_json(w.url, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0},
                      timeout=REQUEST_TIMEOUT)
            gauge = counters(w.url, [series.PREFIX_CACHE_BYTES])[series.PREFIX_CACHE_BYTES] / 2**20
            kib = memory_kib(w.pid)
            after.append({"rss_mib": kib["VmRSS"] / 1024, "hwm_mib": kib["VmHWM"] / 1024, "gauge_mib": gauge})
            print(f"memory {build}: prompt {i + 1}: resident +{after[-1]['rss_mib'] - idle:.0f} MiB, the cache counts "
                  f"{gauge:.0f} MiB", file=sys.stderr)
    return {"build": build, "idle_rss_mib": idle, "after": after}


# -- `claude_code`: Claude Code's turns against `mtpstack up`'s demo ----------------------


@asynccontextmanager
async def relay(upstream: str):
    """A relay to `upstream` while the block runs: its URL, and a record per `/v1/messages`."""
    records: list[dict] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        record = {"path": request.path, "status": None, "ttft_s": None, "usage": None, "final_usage": None,
                  "billing": billing_of(body)}
        async with session.request(request.method, upstream + request.path_qs, data=body, headers=headers) as up:
            record["status"] = up.status
            kept = {k: v for k, v in up.headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
            resp = web.StreamResponse(status=up.status, headers=kept)
            await resp.prepare(request)
            buffer = b""
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
                buffer += chunk
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    observe(record, event, time.perf_counter() - arrived)
            await resp.write_eof()
        if request.path.startswith("/v1/messages") and not request.path.endswith("count_tokens"):
            records.append(record)
        return resp

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", forward)
    runner, port = web.AppRunner(app, access_log=None), free_port()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=REQUEST_TIMEOUT)) as session:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            yield url_of("127.0.0.1", port), records
        finally:
            await runner.cleanup()


def billing_of(body: bytes) -> str | None:
    """Claude Code's billing line, its first system block, if any."""
    try:
        system = json.loads(body).get("system")
    except (ValueError, AttributeError):
        return None
    first = system[0] if isinstance(system, list) and system and isinstance(system[0], dict) else {}
    text = first.get("text")
    return text if isinstance(text, str) and text.startswith("x-anthropic-billing-header:") else None


def changing_fields(lines: list[str | None]) -> list[str]:
    """The billing lines' fields that differ between requests, in the order first seen."""
    seen: dict[str, set[str]] = {}
    for line in lines:
        for field in (line or "").split(":", 1)[-1].split(";"):
            key, _, value = field.strip().partition("=")
            if key:
                seen.setdefault(key, set()).add(value)
    return [k for k, values in seen.items() if len(values) > 1]


def observe(record: dict, event: bytes, elapsed: float) -> None:
    """Fold one server-sent event into a request's record."""
    data = next((line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")), None)
    try:
        payload = json.loads(data) if data is not None else None
    except ValueError:
        return
    kind = payload.get("type") if isinstance(payload, dict) else None
    if kind == "message_start":
        record["usage"] = payload["message"]["usage"]
    elif kind == "content_block_start" and record["ttft_s"] is None:
        record["ttft_s"] = round(elapsed, 3)
    elif kind == "message_delta":
        record["final_usage"] = payload.get("usage")


def _prompt(r: dict) -> int:
    return r["usage"]["input_tokens"] + r["usage"].get("cache_read_input_tokens", 0)


def turn_requests(records: list[dict]) -> list[dict]:
    """A turn's own requests, in order: those with a prompt at least half the longest (Claude Code may
    send small side requests). The first is the turn's; one after it carries a tool's result."""
    full = [r for r in records if r["usage"]]
    longest = max((_prompt(r) for r in full), default=0)
    return [r for r in full if _prompt(r) * 2 >= longest]


def claude_lines(result: dict) -> list[str]:
    lines = ["| turn | prompt tokens | TTFT s, median (min-max) | cache_read_input_tokens, median (min-max) | n |",
             "|---|---|---|---|---|"]
    for label in (x for t, *_ in CLAUDE_TURNS for x in (t, AFTER_RESULT.format(t))):
        if turns := [r[label] for r in result["rounds"] if r.get(label)]:
            ttft, read, prompt = (spread([t[key] for t in turns])
                                  for key in ("ttft_s", "cache_read_input_tokens", "prompt_tokens"))
            lines.append(f"| {label} | {prompt['median']:,.0f} | {fmt(ttft, '', 2, count=False)} | "
                         f"{read['median']:,.0f} ({read['min']:,.0f}-{read['max']:,.0f}) | {len(turns)} |")
    changing = ", ".join(result.get("changing_fields") or []) or "none"
    mode = f"first-party mode, billing fields changing per request: {changing}" if result.get("first_party") \
        else "default mode"
    load = {when: " ".join(map(str, result.get(f"loadavg_{when}") or ["?"])) for when in ("before", "after")}
    return lines + [f"Claude Code {result['claude_version']} ({mode}); load average before {load['before']}, "
                    f"after {load['after']}."]


async def claude_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """`CLAUDE_TURNS` through the relay to a fresh `mtpstack up` demo fleet."""
    from mtpstack.up import DEMO_MODEL, default_fleet

    work = workdir / f"claude-{rnd}"
    work.mkdir()
    config = default_fleet()
    config["proxy"]["port"], config["workers"]["demo"]["port"] = free_port(), free_port()
    (work / "fleet.json").write_text(json.dumps(config))
    up = Process([sys.executable, "-m", "mtpstack", "up", str(work / "fleet.json"), "--run-dir", str(work / "run")],
                 log_path=work / "up.log", name="demo", kind="up", url=url_of("127.0.0.1", config["proxy"]["port"]))
    up.start()
    try:
        try:
            up.wait_ready("/readyz", 300)  # the proxy `mtpstack up` starts, ready once its worker is
        except StartError as e:
            raise SystemExit(f"error: `mtpstack up` was not ready: {e}") from None
        out: dict = {}
        async with relay(up.url) as (relay_url, records):
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work / "home"), "NO_COLOR": "1",
                   "ANTHROPIC_BASE_URL": relay_url, "ANTHROPIC_AUTH_TOKEN": "bench", "ANTHROPIC_MODEL": DEMO_MODEL,
                   "ANTHROPIC_SMALL_FAST_MODEL": DEMO_MODEL, "DISABLE_TELEMETRY": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **(FIRST_PARTY_ENV if args.first_party else {})}
            (work / "home").mkdir()
            for label, prompt, again, folder in CLAUDE_TURNS:
                cwd = work / folder
                cwd.mkdir(exist_ok=True)
                (cwd / "a.txt").write_text("hello\n")
                before = len(records)
                argv = [str(args.claude), *(["-c"] if again else []), "-p", prompt, "--max-turns", "3",
                        "--allowedTools", "Bash,Read"]
                done = await asyncio.to_thread(subprocess.run, argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                               capture_output=True, text=True, timeout=REQUEST_TIMEOUT)
                requests = turn_requests(records[before:])
                if done.returncode != 0 or not requests:
                    raise SystemExit(f"error: turn `{label}`: claude exited {done.returncode}, "
                                     f"{len(records) - before} requests\n{done.stderr[-2000:]}")
                for name, request in zip((label, AFTER_RESULT.format(label)), requests):
                    out[name] = {"ttft_s": request["ttft_s"], "prompt_tokens": _prompt(request),
                                 "cache_read_input_tokens": request["usage"].get("cache_read_input_tokens", 0),
                                 "output_tokens": (request["final_usage"] or {}).get("output_tokens"),
                                 "requests": len(records) - before, "exit": done.returncode}
                    print(f"  {name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
            out["billing"] = [r["billing"] for r in records]
        return out
    finally:
        up.interrupt()


async def measure_rounds(scenario: str, one_round, session, target, head, args, workdir: Path) -> list[dict]:
    """A scenario's rounds on workers of its own, the warm-up discarded."""
    kept = []
    for rnd, keep in rounds(args.warmup, args.rounds):
        r = await one_round(session, target, head, args, workdir, rnd)
        print(f"{scenario} round {rnd}: {r}", file=sys.stderr)
        if keep:
            kept.append(r)
    return kept


async def claude_code(session, args, workdir: Path) -> dict:
    """Claude Code's rounds and the billing fields that changed between requests."""
    version = subprocess.run([str(args.claude), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    result = {"claude_version": version, "first_party": args.first_party, "loadavg_before": loadavg()}
    result["rounds"] = await measure_rounds("claude_code", claude_round, session, None, None, args, workdir)
    result["changing_fields"] = changing_fields([b for r in result["rounds"] for b in r.pop("billing")])
    return {**result, "loadavg_after": loadavg()}


#: The scenarios of workers of their own measured in rounds, and the summary of each.
OWN_ROUNDS = {"restart": (restart_round, restart_summary), "spill_itl": (spill_round, spill_summary),
              "restore_itl": (restore_round, restore_summary)}


async def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="agent-bench-"))
    on = set(args.only or (name for name in SCENARIOS if name != "claude_code"))
    target = head = source = None
    if on - {"claude_code"}:
        target, head, source = demo_pair(workdir, *((1, 0) if args.quick else WIDEN), CONTEXT)
        source += " (a speed measurement: text past the trained length is not judged)"
        print(f"models: {source}", file=sys.stderr)
    samples: dict = {name: {"turns": [], "turns_by_thinking": {}, "shared": [], "concurrent": [], "prefill_itl": []}
                     for name in SERVERS if on - OWN_WORKERS}
    prompt_tokens, summary = None, {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as session:
        if on - OWN_WORKERS:
            prompt_tokens = await shared_servers(session, args, target, head, workdir, on, samples)
        for scenario, (one_round, of) in OWN_ROUNDS.items():
            if scenario in on:
                samples[scenario] = await measure_rounds(scenario, one_round, session, target, head, args, workdir)
                summary[scenario] = of(samples[scenario])
        if "memory" in on:
            samples["memory"] = [memory_flood(head, args, workdir, build, program)
                                 for build, program in builds(args).items()]
            summary["memory"] = memory_summary(samples["memory"])
        if "claude_code" in on:
            summary["claude_code"] = await claude_code(session, args, workdir)
    return {"source": source, "rounds": args.rounds, "warmup": args.warmup, "depth": DEPTH, "tools": args.tools,
            "prompt_tokens": prompt_tokens, "samples": samples, "summary": {**summarize_samples(samples), **summary}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--tools", type=int, default=40, help="tool lines in the system prompt (default: 40)")
    p.add_argument("--quick", action="store_true", help="the shipped demo unwidened, 1 round, no warm-up, 12 tools")
    p.add_argument("--only", nargs="+", choices=SCENARIOS, help="these scenarios (default: all but claude_code)")
    p.add_argument("--flood", type=int, default=8, help="`memory`: distinct prompts sent (default: 8)")
    p.add_argument("--baseline", help="`memory`, `restore_itl`: also a worker run by this `mtpstack` (another build)")
    p.add_argument("--claude", type=Path, default=Path(os.environ.get("MTPSTACK_CLAUDE") or CLAUDE),
                   help="`claude_code`: the `claude` binary (default: .claude-code/, from scripts/bootstrap-npm)")
    p.add_argument("--first-party", action="store_true", help="`claude_code`: Claude Code in its first-party mode")
    p.add_argument("--out", help="write the JSON report here instead of stdout")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.tools = 1, 0, 12
    if "claude_code" in (args.only or []) and not args.claude.exists() and shutil.which(str(args.claude)) is None:
        p.error(f"no Claude Code at {args.claude}; run scripts/bootstrap-npm or pass --claude")
    ensure_preload()
    report = asyncio.run(run(args))
    return emit(report, format_lines(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
