"""Agent benchmark: what the prefix cache saves an agent, side by side with mlx_lm.server's prompt cache, one run.

`native+mtp` (the native worker, the MTP head, its prefix cache at the default budget) and `mlx_lm.server`
(its own prompt cache), started once and used alternately; each round a fresh system prompt (a coding
agent's, with a tool list), so nothing carries over:
  1. `turns`: a 6-turn conversation fed its greedy answers, TTFT per turn, per `--thinking` mode;
  2. `shared`: a second conversation on the same system prompt, its first turn against the first's;
  3. `concurrent`: 4 clients at once with distinct prompts (no cache hits), median TTFT;
  4. `prefill_itl` (native only): one streaming row's gaps while a 2,000-token prompt is prefilled beside it.
On native workers of their own, started afresh:
  5. `restart`: a first turn on a worker with a disk tier, the worker restarted on its directory, the next
     turn, against it prefilled whole by a fresh worker (both TTFTs, the restore's GB/s, the first's writes);
  6. `memory`: `--flood` distinct prompts into one worker of the shipped demo pair: its resident memory
     (VmRSS, VmHWM) against `mtpstack_worker_prefix_cache_bytes` after each;
  7. `spill_itl`: a row's gaps while distinct prompts pass a small budget (`SPILL_GIB`) beside it, memory
     only and with a disk tier taking every snapshot;
  8. `restore_itl`: the row's gaps while a prompt on disk only is restored `--restores` times beside it,
     against the gaps outside those windows.
`--baseline PROGRAM` runs `memory` and `restore_itl` for another build too (before and after a change).

    python bench/scripts/agent_bench.py --out bench-agent.json        # the demo pair, target widened to ~70M
    python bench/scripts/agent_bench.py --quick                        # the shipped demo as it is, 1 round
    python bench/scripts/agent_bench.py --only memory restore_itl --baseline /tmp/base/.venv/bin/mtpstack

Raw samples and summaries go to stdout (or --out) as JSON; a readable table to stderr.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path

from mtpstack import series
from mtpstack.bench.conversations import REQUEST_TIMEOUT, answered, run_sessions
from mtpstack.bench.load import memory_kib
from mtpstack.bench.parts import demo_pair, emit, ensure_preload, fmt, post_json, rotated, rounds, spread
from mtpstack.bench.servers import metrics, start_servers, start_workers, stream_chat, worker_command, worker_profile
from mtpstack.bench.workloads import ANSWER_TOKENS, CONTEXT, FOLLOW_UPS, TURNS, conversation, opening, system_prompt
from mtpstack.proxy.prometheus import sample
from mtpstack.runtime import free_port

SERVERS = ["native+mtp", "mlx_lm.server"]
SCENARIOS = ["turns", "shared", "concurrent", "prefill_itl", "restart", "memory", "spill_itl", "restore_itl"]
#: The scenarios that start workers of their own rather than use the two servers.
OWN_WORKERS = {"restart", "memory", "spill_itl", "restore_itl"}
#: `spill_itl`: the memory budget both workers get, small enough that the flood spills past it.
SPILL_GIB = 0.01
#: What a worker's disk tier logs when it stops (`prefix_disk.DiskTier.close`): its writes' count, MB, seconds, sync seconds.
TIER_STOPS = re.compile(r"the disk tier stops: (\d+) writes, ([\d.]+) MB in ([\d.]+) s, ([\d.]+) s of it syncing")
#: `--thinking`: the template's `enable_thinking` for the turns.
THINKING = {"off": False, "on": True}
#: A server's rows of the table: (label, key, what its ratio is over, the ratio's key).
SERVER_ROWS = [("turn 1 TTFT", "turn1_ttft_s", None, None),
               ("turns 2+ TTFT", "later_ttft_s", "own turn 1", "later_over_turn1"),
               ("shared system", "shared_ttft_s", "first conversation", "shared_over_first"),
               ("4 clients TTFT", "concurrent_ttft_s", None, None)]


def ratio(a, b):
    return a / b if a and b else None


def known(rows: list[dict], key: str) -> dict:
    """`key` summarized over the rows that measured it (a value, not None or 0)."""
    return spread([r[key] for r in rows if r.get(key)])


# -- pure summaries (unit-testable) ------------------------------------------------------


def summarize_samples(samples: dict) -> dict:
    """Raw samples -> medians with min-max, per server and scenario."""
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
                **{key: spread([w[key] for w in windows]) for key in ("median_s", "p99_s")},
                "p99_over_median": spread([w["p99_s"] / w["median_s"] for w in windows if w["median_s"]]),
                "outside_median_s": known(windows, "outside_median_s"),
            }
    return out


def turns_summary(turns: list[list[float]]) -> dict:
    """Time to first token of each conversation's turns: turn 1, the later ones, and each
    conversation's later turns over its own turn 1."""
    return {
        "turn1_ttft_s": spread([conv[0] for conv in turns if conv]),
        "later_ttft_s": spread([t for conv in turns for t in conv[1:]]),
        "later_over_turn1": spread([statistics.median(conv[1:]) / conv[0] for conv in turns if len(conv) > 1 and conv[0]]),
        "per_turn_ttft_s": [spread([conv[i] for conv in turns if len(conv) > i]) for i in range(max(map(len, turns), default=0))],
    }


def restart_summary(rounds: list[dict]) -> dict:
    """The next turn after a restart against the same turn prefilled whole, round by round."""
    restored, wrote = [r for r in rounds if r.get("restore_s")], [r for r in rounds if r.get("write_s")]
    return {
        **{key: spread([r[key] for r in rounds])
           for key in ("restart_ttft_s", "cold_ttft_s", "cached_tokens", "prompt_tokens")},
        "restart_over_cold": spread([r["restart_ttft_s"] / r["cold_ttft_s"] for r in rounds if r["cold_ttft_s"]]),
        "restore_s": spread([r["restore_s"] for r in restored]),
        "restore_gb_s": spread([r["read_bytes"] / r["restore_s"] / 1e9 for r in restored if r.get("read_bytes")]),
        **{key: spread([r[key] for r in wrote]) for key in ("write_s", "sync_s", "written_mb")},
        "sync_share": spread([r["sync_s"] / r["write_s"] for r in wrote]),
    }


def memory_summary(floods: list[dict]) -> dict:
    """Per flood: how much resident memory grew (from the idle worker) against what the cache counts."""
    out = {}
    for f in floods:
        after, base = f["after"], f["idle_rss_mib"]
        out[f["build"]] = {
            "prompts": len(after),
            "rss_growth_mib": [round(a["rss_mib"] - base, 1) for a in after],
            "peak_growth_mib": [round(a["hwm_mib"] - base, 1) for a in after],
            "gauge_mib": [round(a["gauge_mib"], 1) for a in after],
            "growth_per_prompt_mib": spread([b["rss_mib"] - a["rss_mib"] for a, b in zip(after, after[1:])]),
            "growth_over_gauge": (after[-1]["rss_mib"] - base) / after[-1]["gauge_mib"] if after and after[-1]["gauge_mib"] else None,
        }
    return out


def restore_summary(rounds: list[dict]) -> dict:
    out = {}
    for build in rounds[0] if rounds else []:
        mine = [r[build] for r in rounds]
        out[build] = {k: spread([m[k] for m in mine if m.get(k) is not None])
                      for k in ("median_s", "p99_s", "max_s", "outside_median_s", "disk_hits", "read_mb", "restore_s")}
        out[build]["inside_over_outside"] = spread([m["median_s"] / m["outside_median_s"] for m in mine
                                                       if m.get("median_s") and m.get("outside_median_s")])
    return out


def spill_summary(rounds: list[dict]) -> dict:
    out = {v: {"median_s": known([r[v] for r in rounds], "median_s"), "p99_s": known([r[v] for r in rounds], "p99_s"),
               "disk_writes": spread([r[v]["disk_writes"] for r in rounds])} for v in ("memory", "disk")}
    out["p99_disk_over_memory"] = spread([r["disk"]["p99_s"] / r["memory"]["p99_s"] for r in rounds
                                             if r["disk"]["p99_s"] and r["memory"]["p99_s"]])
    return out


def measured(v: dict | None) -> bool:
    """Did a server's summary measure any of the scenarios on the two servers?"""
    return bool(v) and any(v[k]["n"] for k in ("turn1_ttft_s", "shared_ttft_s", "concurrent_ttft_s"))


def format_lines(report: dict) -> list[str]:
    s = report["summary"]
    lines = [f"{report['rounds']} rounds (+{report['warmup']} warm-up discarded), {TURNS} turns, prompts "
             f"{report.get('prompt_tokens', '?')} tokens, servers alternated"]
    for server, v in s.items():
        if server in OWN_WORKERS or not measured(v):
            continue
        lines.append(f"{server}")
        for label, key, over, ratio_key in SERVER_ROWS:
            ratio_cell = f"   (/ {over}: {fmt(v[ratio_key], 'x', 3)})" if over else ""
            lines.append(f"  {label:<16} {fmt(v[key], ' s', 3)}{ratio_cell}")
            if key == "later_ttft_s":
                lines += [f"  thinking {mode:<3}: turn 1 {fmt(t['turn1_ttft_s'], ' s', 3)}, turns 2+ "
                          f"{fmt(t['later_ttft_s'], ' s', 3)} (/ own turn 1: {fmt(t['later_over_turn1'], 'x', 3)})"
                          for mode, t in v.get("thinking", {}).items()]
        if "prefill_itl" in v:
            p = v["prefill_itl"]
            lines.append(f"  ITL beside a 2,000-token prefill: median {fmt(p['median_s'], ' s', 3)}, p99 {fmt(p['p99_s'], ' s', 3)}, "
                         f"p99/median {fmt(p['p99_over_median'], 'x', 2)}; outside it median {fmt(p['outside_median_s'], ' s', 3)}")
    a, b = s.get(SERVERS[0]), s.get(SERVERS[1])
    if b and measured(a):
        for key, name in (("later_ttft_s", "turns 2+ TTFT"), ("shared_ttft_s", "shared-system TTFT"), ("concurrent_ttft_s", "4-client TTFT")):
            r = ratio(a[key]["median"], b[key]["median"])
            lines.append(f"{name}: {SERVERS[0]} / {SERVERS[1]} = {r:.2f}x" if r else f"{name}: n/a")
        for mode in a.get("thinking", {}):
            r = ratio(a["thinking"][mode]["later_ttft_s"]["median"], b.get("thinking", {}).get(mode, {}).get("later_ttft_s", {}).get("median"))
            lines.append(f"turns 2+ TTFT, thinking {mode}: {SERVERS[0]} / {SERVERS[1]} = {r:.2f}x" if r else f"thinking {mode}: n/a")
    if "restart" in s:
        r = s["restart"]
        lines.append(f"restart ({fmt(r['prompt_tokens'], '', 0)} tokens, {fmt(r['cached_tokens'], '', 0)} from disk): next turn "
                     f"{fmt(r['restart_ttft_s'], ' s', 3)} against {fmt(r['cold_ttft_s'], ' s', 3)} prefilled whole: "
                     f"{fmt(r['restart_over_cold'], 'x', 3)}; restore {fmt(r['restore_s'], ' s', 3)} at {fmt(r['restore_gb_s'], ' GB/s', 2)}")
        if r.get("write_s", {}).get("n"):
            lines.append(f"  the first turn's writes ({fmt(r['written_mb'], ' MB', 1)}): {fmt(r['write_s'], ' s', 3)}, of it syncing "
                         f"{fmt(r['sync_s'], ' s', 3)}: {fmt(r['sync_share'], '', 2)} of the write time")
    if "spill_itl" in s:
        sp = s["spill_itl"]
        lines += [f"a row's gaps beside a spilling flood, {v}: median {fmt(sp[v]['median_s'], ' s', 3)}, "
                  f"p99 {fmt(sp[v]['p99_s'], ' s', 3)} ({fmt(sp[v]['disk_writes'], '', 0)} disk writes)"
                  for v in ("memory", "disk")]
        lines.append(f"  p99 with the disk tier / memory only: {fmt(sp['p99_disk_over_memory'], 'x', 2)}")
    for build, r in s.get("restore_itl", {}).items():
        lines.append(f"a row's gaps beside a restore from disk, {build} ({fmt(r['read_mb'], ' MB', 1)} a restore in "
                     f"{fmt(r['restore_s'], ' s', 3)}): median {fmt(r['median_s'], ' s', 3)}, max {fmt(r['max_s'], ' s', 3)}; "
                     f"outside the restores median {fmt(r['outside_median_s'], ' s', 3)}: {fmt(r['inside_over_outside'], 'x', 2)}")
    for build, m in s.get("memory", {}).items():
        over = f"{m['growth_over_gauge']:.2f}x" if m["growth_over_gauge"] else "n/a"
        lines.append(f"memory, {build}: after {m['prompts']} prompts resident +{m['rss_growth_mib'][-1]:.0f} MiB "
                     f"(peak +{m['peak_growth_mib'][-1]:.0f}), the cache counts {m['gauge_mib'][-1]:.0f} MiB: {over}; "
                     f"per prompt {fmt(m['growth_per_prompt_mib'], ' MiB', 1)}")
    return lines


def itl_window(times: list[float], start: float, end: float) -> dict:
    """The gaps of one window, [start, end] (`itl_windows`)."""
    return itl_windows(times, [(start, end)])


def itl_windows(times: list[float], windows: list[tuple[float, float]]) -> dict:
    """Gaps between a stream's chunk arrival `times` that end inside any of `windows`, and those outside."""
    gaps = [(b - a, any(s <= b <= e for s, e in windows)) for a, b in zip(times, times[1:])]
    inside = sorted(g for g, within in gaps if within)
    outside = [g for g, within in gaps if not within]
    if not inside:
        return {"median_s": None, "p99_s": None, "n": 0}
    p99 = inside[min(len(inside) - 1, round(0.99 * (len(inside) - 1)))]
    return {"median_s": statistics.median(inside), "p99_s": p99, "max_s": inside[-1], "n": len(inside),
            "outside_median_s": statistics.median(outside) if outside else None}


def tier_writes(log_path: Path) -> dict:
    """A stopped worker's disk-tier writes, from the last line its tier logged when it stopped ({}: none)."""
    found = list(TIER_STOPS.finditer(log_path.read_text(errors="replace"))) if log_path.exists() else []
    if not found:
        return {}
    writes, mb, seconds, sync = found[-1].groups()
    return {"writes": int(writes), "written_mb": float(mb), "write_s": float(seconds), "sync_s": float(sync)}


# -- measurement on the two servers -----------------------------------------------------


async def conversation_turns(url, model, system: str, thinking: bool, tag: str) -> tuple[list[float], list[int]]:
    """A `TURNS`-turn conversation fed its answers (the template's thinking `thinking`): each turn's
    time to first token and prompt tokens."""
    extra = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": thinking}}
    sessions = [conversation(0, system, "what is failing?", TURNS)]
    rows = answered(await run_sessions(url + "/v1", model, sessions, ANSWER_TOKENS, labels={}, tag=tag, extra=extra))
    return [r["ttft_s"] for r in rows], [r["prompt_tokens"] for r in rows]


async def shared(session, url, model, system: str) -> tuple[float, float]:
    first = await stream_chat(session, url, model, opening(system), 8)
    other = await stream_chat(session, url, model, opening(system, "which file is largest?"), 8)
    return other["ttft_s"], first["ttft_s"]


async def concurrent(session, url, model, round_no: int, tools: int) -> float:
    prompts = [f"client {c}. " + system_prompt(round_no * 10 + c, tools // 4) for c in range(4)]
    runs = await asyncio.gather(*(stream_chat(session, url, model, [{"role": "user", "content": p}], 16)
                                  for p in prompts))
    return statistics.median(r["ttft_s"] for r in runs)


async def prefill_itl(session, url, model, round_no: int, tools: int) -> dict:
    times: list[float] = []
    decoding = await decoding_row(session, url, model, f"round {round_no}", times, 400, ignore_eos=False)
    long = await stream_chat(session, url, model, [{"role": "user", "content": system_prompt(1000 + round_no, tools)}], 4)
    await decoding
    return itl_window(times, long["sent"], long["first"])


async def decoding_row(session, url: str, model: str, label: str, times: list, tokens: int = 4000,
                       ignore_eos: bool = True) -> asyncio.Task:
    """A streaming row, a plain completion (`tokens` tokens, its chunks' times in `times`) that has decoded
    its first 20, before anything is sent beside it."""
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
    """A decoding row (`decoding_row`) to measure the block beside: its chunks' times, the row stopped after."""
    times: list[float] = []
    decoding = await decoding_row(session, url, "bench", label, times)
    try:
        yield times
    finally:
        decoding.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await decoding


async def shared_servers(session, args, target: Path, head: Path, workdir: Path, on: set, samples: dict) -> str | None:
    """The scenarios on the two servers, started once and used alternately; the turns' prompt sizes."""
    servers = start_servers(target, head, args.depth, workdir, SERVERS)
    models = {"native+mtp": "bench", "mlx_lm.server": str(target)}
    prompt_tokens = None
    try:
        for rnd, keep in rounds(args.warmup, args.rounds):
            for name in rotated(SERVERS, rnd):
                url, model, got = servers[name].url, models[name], samples[name]
                seed = rnd * 2 + SERVERS.index(name)  # every server and round its own system prompt
                by_mode = {mode: await conversation_turns(url, model, system_prompt(seed * 10 + m, args.tools),
                                                          THINKING[mode], f"agent-{rnd}-{name}-{mode}")
                           for m, mode in enumerate(args.thinking)} if "turns" in on else {}
                ttfts, tokens = by_mode.get(args.thinking[0], ([], []))
                other = (await shared(session, url, model, system_prompt(100 + seed, args.tools))
                         if "shared" in on else None)
                conc = await concurrent(session, url, model, 200 + seed, args.tools) if "concurrent" in on else None
                itl = (await prefill_itl(session, url, model, seed, args.tools)
                       if name == "native+mtp" and "prefill_itl" in on else None)
                print(f"round {rnd} {name}: turns {[round(t, 3) for t in ttfts]} shared {other} 4-clients {conc}"
                      + (f" itl median {itl['median_s']} p99 {itl['p99_s']}" if itl else ""), file=sys.stderr)
                if keep:
                    for key, value in (("turns", ttfts), ("shared", other), ("concurrent", conc),
                                       ("prefill_itl", itl if itl and itl["n"] else None)):
                        if value:
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
def native_worker(target: Path, head: Path, depth: int, logdir: Path, name: str, *, program: str | None = None,
                  cache_dir: Path | None = None, cache_gib: float | None = None):
    """One native worker of 2 rows with the MTP head at the default prefix-cache budget (or `cache_gib`),
    healthy, stopped (SIGTERM: its queued writes finish within its grace) when the block ends;
    `cache_dir`: its disk tier's directory; `program`: another build's `mtpstack`."""
    port = free_port()
    cache = {"dir": str(cache_dir) if cache_dir else None, **({"maxGiB": cache_gib} if cache_gib is not None else {})}
    argv = worker_command(worker_profile(target, head, depth, port, width=2, prefixCache=cache), program)
    w = start_workers({name: (argv, port)}, logdir)[name]
    try:
        yield w
    finally:
        w.stop()


def scrape(url: str, names: list[str]) -> dict[str, float]:
    """The worker's counters `names` (0 when it does not export one)."""
    samples = metrics(url)
    return {name: sample(samples, name) or 0.0 for name in names}


def builds(args) -> dict[str, str | None]:
    """The builds a scenario compares: this checkout's, and `--baseline`'s when given."""
    return {"this checkout": None, **({"baseline": args.baseline} if args.baseline else {})}


async def restart_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """One conversation's first turn, a restart on the disk tier, its next turn; then that next turn
    on a fresh worker with nothing cached (the cold prefill), the order alternating by round."""
    names = [series.PREFIX_CACHE_DISK_READ_BYTES, series.PREFIX_CACHE_DISK_RESTORE_SECONDS + "_sum"]
    cache = workdir / f"restart-cache-{rnd}"
    messages = opening(system_prompt(500 + rnd, args.tools))
    with native_worker(target, head, args.depth, workdir, f"restart-{rnd}-a", cache_dir=cache) as w:
        first = await stream_chat(session, w.url, "bench", messages, ANSWER_TOKENS)
    writes = tier_writes(w.log_path)
    messages = messages + [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": FOLLOW_UPS[0]}]

    async def next_turn(label: str, cache: Path) -> dict:
        with native_worker(target, head, args.depth, workdir, f"restart-{rnd}-{label}", cache_dir=cache) as w:
            before = scrape(w.url, names)
            r = await stream_chat(session, w.url, "bench", messages, ANSWER_TOKENS)
            return {**r, **{k: v - before[k] for k, v in scrape(w.url, names).items()}}

    turns = {"b": cache, "cold": workdir / f"cold-cache-{rnd}"}
    got = {label: await next_turn(label, turns[label]) for label in rotated(list(turns), rnd)}
    hot, usage = got["b"], got["b"]["usage"]
    return {"restart_ttft_s": hot["ttft_s"], "cold_ttft_s": got["cold"]["ttft_s"], "read_bytes": hot[names[0]],
            "restore_s": hot[names[1]], **writes, "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


async def restore_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """A decoding row's gaps while a prompt is restored from disk beside it `--restores` times, for this
    checkout and `--baseline` (each on a copy of one primed directory), the order alternating by round."""
    names = [series.PREFIX_CACHE_DISK_HITS, series.PREFIX_CACHE_DISK_READ_BYTES, series.PREFIX_CACHE_DISK_RESTORE_SECONDS + "_sum"]
    messages = opening(system_prompt(900 + rnd, args.tools))
    primed = workdir / f"restore-primed-{rnd}"
    with native_worker(target, head, args.depth, workdir, f"restore-{rnd}-prime", cache_gib=SPILL_GIB,
                       cache_dir=primed) as w:
        await stream_chat(session, w.url, "bench", messages, 1)  # stopped after: the snapshots are on disk
    programs, out = builds(args), {}
    for b, build in enumerate(rotated(list(programs), rnd)):
        cache = Path(shutil.copytree(primed, workdir / f"restore-{rnd}-{b}"))
        with native_worker(target, head, args.depth, workdir, f"restore-{rnd}-{b}", program=programs[build],
                           cache_gib=SPILL_GIB, cache_dir=cache) as w:
            async with beside_a_row(session, w.url, f"restore {rnd}") as times:
                before, windows = scrape(w.url, names), []
                for _ in range(args.restores):
                    r = await stream_chat(session, w.url, "bench", messages, 1)
                    windows.append((r["sent"], r["first"]))
                after = scrape(w.url, names)
            hits, read, seconds = (after[k] - before[k] for k in names)
        out[build] = {**itl_windows(times, windows), "disk_hits": hits, "read_mb": read / 1e6 / max(hits, 1),
                      "restore_s": seconds / max(hits, 1)}
    return out


async def spill_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """The decoding row's gaps while the flood arrives: memory only, and with a disk tier."""
    out = {}
    for variant in rotated(["memory", "disk"], rnd):
        with native_worker(target, head, args.depth, workdir, f"spill-{rnd}-{variant}", cache_gib=SPILL_GIB,
                           cache_dir=workdir / f"spill-cache-{rnd}" if variant == "disk" else None) as w:
            async with beside_a_row(session, w.url, f"spill {rnd}") as times:
                start = time.perf_counter()
                for i in range(args.spill_prompts):
                    prompt = system_prompt(700 + rnd * 50 + i, args.tools // 2)
                    await stream_chat(session, w.url, "bench", [{"role": "user", "content": prompt}], 1)
                end = time.perf_counter()
            writes = scrape(w.url, [series.PREFIX_CACHE_DISK_WRITES, series.PREFIX_CACHE_EVICTIONS])
        out[variant] = {**itl_window(times, start, end), "disk_writes": writes[series.PREFIX_CACHE_DISK_WRITES],
                        "evictions": writes[series.PREFIX_CACHE_EVICTIONS]}
    return out


def memory_flood(head: Path, args, workdir: Path, build: str, program: str | None) -> dict:
    """`--flood` distinct prompts of `--flood-tokens` token ids, one after another, into one worker of
    the shipped demo pair at the default budget; resident memory and the gauge after each."""
    from mtpstack.worker.demo import DEMO_TARGET

    rng, after = random.Random(11), []
    with native_worker(Path(DEMO_TARGET), head, args.depth, workdir, f"memory-{build}", program=program) as w:
        idle = memory_kib(w.pid)["VmRSS"] / 1024
        for i in range(args.flood):
            prompt = [rng.randrange(3, 1000) for _ in range(args.flood_tokens)]
            post_json(w.url, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0},
                      timeout=REQUEST_TIMEOUT)
            gauge = scrape(w.url, [series.PREFIX_CACHE_BYTES])[series.PREFIX_CACHE_BYTES] / 2**20
            kib = memory_kib(w.pid)
            after.append({"rss_mib": kib["VmRSS"] / 1024, "hwm_mib": kib["VmHWM"] / 1024, "gauge_mib": gauge})
            print(f"memory {build}: prompt {i + 1}: resident +{after[-1]['rss_mib'] - idle:.0f} MiB, the cache counts "
                  f"{gauge:.0f} MiB", file=sys.stderr)
    return {"build": build, "idle_rss_mib": idle, "after": after}


#: The scenarios of workers of their own measured in rounds, and the summary of each.
OWN_ROUNDS = {"restart": (restart_round, restart_summary), "spill_itl": (spill_round, spill_summary),
              "restore_itl": (restore_round, restore_summary)}


async def run(args) -> dict:
    import aiohttp

    workdir = Path(tempfile.mkdtemp(prefix="agent-bench-"))
    widen = (1, 0) if args.quick else (args.mlp_multiplier, args.extra_layers)
    target, head, source = demo_pair(workdir, *widen, CONTEXT)
    source += " (a speed measurement: text past the trained length is not judged)"
    print(f"models: {source}", file=sys.stderr)
    on = set(args.only or SCENARIOS)
    samples: dict = {name: {"turns": [], "turns_by_thinking": {}, "shared": [], "concurrent": [], "prefill_itl": []} for name in SERVERS}
    prompt_tokens, summary = None, {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as session:
        if on - OWN_WORKERS:
            prompt_tokens = await shared_servers(session, args, target, head, workdir, on, samples)
        for scenario, (one_round, of) in OWN_ROUNDS.items():
            if scenario in on:
                samples[scenario] = []
                for rnd, keep in rounds(args.warmup, args.rounds):
                    r = await one_round(session, target, head, args, workdir, rnd)
                    print(f"{scenario} round {rnd}: {r}", file=sys.stderr)
                    if keep:
                        samples[scenario].append(r)
                summary[scenario] = of(samples[scenario])
    if "memory" in on:
        samples["memory"] = [memory_flood(head, args, workdir, build, program)
                             for build, program in builds(args).items()]
        summary["memory"] = memory_summary(samples["memory"])
    return {"source": source, "rounds": args.rounds, "warmup": args.warmup, "depth": args.depth, "tools": args.tools,
            "prompt_tokens": prompt_tokens, "samples": samples, "summary": {**summarize_samples(samples), **summary}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--tools", type=int, default=40, help="tool lines in the system prompt (default: 40)")
    p.add_argument("--mlp-multiplier", type=int, default=8)
    p.add_argument("--extra-layers", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="the shipped demo unwidened, 1 round, no warm-up, 12 tools")
    p.add_argument("--only", nargs="+", choices=SCENARIOS, help="run only these scenarios (default: all)")
    p.add_argument("--thinking", nargs="+", choices=list(THINKING), default=list(THINKING),
                   help="the turns with the template's thinking off and/or on (default: both)")
    p.add_argument("--spill-prompts", type=int, default=4, help="`spill_itl`: distinct prompts sent beside the row (default: 4)")
    p.add_argument("--restores", type=int, default=4, help="`restore_itl`: restores from disk beside the row (default: 4)")
    p.add_argument("--flood", type=int, default=8, help="`memory`: distinct prompts sent (default: 8)")
    p.add_argument("--flood-tokens", type=int, default=8192, help="`memory`: tokens per prompt (default: 8192)")
    p.add_argument("--baseline", help="`memory`, `restore_itl`: the same with a worker run by this `mtpstack` (another build)")
    p.add_argument("--out", help="write the JSON report here instead of stdout")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.tools = 1, 0, 12
    ensure_preload()
    report = asyncio.run(run(args))
    return emit(report, format_lines(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
