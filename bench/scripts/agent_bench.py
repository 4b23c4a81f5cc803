"""Agent benchmark: what the prefix cache saves an agent, side by side with mlx_lm.server's prompt cache, one run.

Servers (started once, idle between measurements, used alternately so drift hits both alike):
  - `native+mtp`: the native worker with the MTP head and its prefix cache (the default budget);
  - `mlx_lm.server`: the same target, plain batching, its own prompt cache (`--prompt-cache-bytes`).

Scenarios, each round with a fresh system prompt so that nothing carries over between rounds:
  1. `turns`: a 6-turn agent conversation (a long tool list as system prompt; each greedy answer
     appended as the assistant turn), time to first token per turn;
  2. `shared`: a second conversation with the same system prompt and another question, its
     first turn's time to first token against the first conversation's;
  3. `concurrent`: 4 clients at once with distinct prompts (no cache hits), median time to first token;
  4. `prefill_itl` (native only): the time between one streaming row's chunks while a 2,000-token
     prompt is prefilled beside it, p99 against median within that window.
  `turns` runs once per `--thinking` mode (the template's `enable_thinking`, sent to both servers).

Scenarios with workers of their own (native only, one worker at a time, started afresh):
  5. `restart`: a conversation's first turn on a worker with a disk tier, the worker stopped and
     started again on its directory, its next turn; against the same next turn prefilled whole by a
     fresh worker. Reports both times to first token, their ratio and the restore's GB/s
     (`mtpstack_worker_prefix_cache_disk_read_bytes_total` over the restore seconds' sum); and the
     first worker's writes (from the line its disk tier logs when it stops): their seconds and the
     share of them its fsyncs took.
  6. `memory`: `--flood` distinct `--flood-tokens`-token prompts one after another into one worker at
     the default budget (the shipped demo pair): its resident memory (VmRSS, VmHWM) against
     `mtpstack_worker_prefix_cache_bytes` after each; with `--baseline PROGRAM` the same for another
     build (before and after a change).
  7. `spill_itl`: one streaming row's time between chunks while distinct prompts (a tool list each)
     arrive one after another beside it, into a worker whose small memory budget (`SPILL_GIB`) they
     pass: memory only, and with a disk tier taking every snapshot; p99 and median of each, rounds
     alternating which goes first.
  8. `restore_itl`: the same streaming row's gaps while a long prompt whose snapshots are on disk
     only (a worker primed it into a directory each build's worker starts on a copy of, memory at
     `SPILL_GIB`) is sent `--restores` times beside it, each a restore from disk; against the gaps
     outside those windows; with `--baseline PROGRAM` the same for another build, rounds alternating.

    python bench/scripts/agent_bench.py --out bench-agent.json        # the demo pair, target widened to ~70M
    python bench/scripts/agent_bench.py --quick                        # the shipped demo as it is, 1 round
    python bench/scripts/agent_bench.py --only restart --rounds 5
    python bench/scripts/agent_bench.py --only memory --baseline /tmp/base/.venv/bin/mtpstack
    python bench/scripts/agent_bench.py --only restore_itl --baseline /tmp/base/.venv/bin/mtpstack

Raw samples and summaries go to stdout (or --out) as JSON; a readable table to stderr.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mtpstack.bench.parts import emit, ensure_preload, fmt, longer_context, summarize
from mtpstack.bench.servers import start_servers, stream_chat
from mtpstack.bench.conversations import answered, run_sessions
from mtpstack.bench.workloads import ANSWER_TOKENS, CONTEXT, FOLLOW_UPS, TURNS, conversation, system_prompt

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
REQUEST_TIMEOUT = 900


def ratio(a, b):
    return a / b if a and b else None


# -- pure summaries (unit-testable) ------------------------------------------------------


def summarize_samples(samples: dict) -> dict:
    """Raw samples -> medians with min-max, per server and scenario."""
    out: dict = {}
    for server, s in samples.items():
        if server in OWN_WORKERS:
            continue
        turns = s.get("turns", [])
        out[server] = {
            **turns_summary(turns),
            "thinking": {mode: turns_summary(convs) for mode, convs in (s.get("turns_by_thinking") or {}).items()},
            "shared_ttft_s": summarize([x for x, _ in s.get("shared", [])]),
            "shared_over_first": summarize([x / f for x, f in s.get("shared", []) if f]),
            "concurrent_ttft_s": summarize(s.get("concurrent", [])),
        }
        if s.get("prefill_itl"):
            out[server]["prefill_itl"] = {
                "median_s": summarize([w["median_s"] for w in s["prefill_itl"]]),
                "p99_s": summarize([w["p99_s"] for w in s["prefill_itl"]]),
                "p99_over_median": summarize([w["p99_s"] / w["median_s"] for w in s["prefill_itl"] if w["median_s"]]),
                "outside_median_s": summarize([w["outside_median_s"] for w in s["prefill_itl"] if w.get("outside_median_s")]),
            }
    return out


def turns_summary(turns: list[list[float]]) -> dict:
    """Time to first token of each conversation's turns: turn 1, the later ones, and each
    conversation's later turns over its own turn 1."""
    later = [t for conv in turns for t in conv[1:]]
    return {
        "turn1_ttft_s": summarize([conv[0] for conv in turns if conv]),
        "later_ttft_s": summarize(later),
        "later_over_turn1": summarize([statistics.median(conv[1:]) / conv[0] for conv in turns if len(conv) > 1 and conv[0]]),
        "per_turn_ttft_s": [summarize([conv[i] for conv in turns if len(conv) > i]) for i in range(max(map(len, turns), default=0))],
    }


def restart_summary(rounds: list[dict]) -> dict:
    """The next turn after a restart against the same turn prefilled whole, round by round."""
    return {
        "restart_ttft_s": summarize([r["restart_ttft_s"] for r in rounds]),
        "cold_ttft_s": summarize([r["cold_ttft_s"] for r in rounds]),
        "restart_over_cold": summarize([r["restart_ttft_s"] / r["cold_ttft_s"] for r in rounds if r["cold_ttft_s"]]),
        "restore_s": summarize([r["restore_s"] for r in rounds if r.get("restore_s")]),
        "restore_gb_s": summarize([r["read_bytes"] / r["restore_s"] / 1e9 for r in rounds if r.get("restore_s") and r.get("read_bytes")]),
        "write_s": summarize([r["write_s"] for r in rounds if r.get("write_s")]),
        "sync_s": summarize([r["sync_s"] for r in rounds if r.get("write_s")]),
        "sync_share": summarize([r["sync_s"] / r["write_s"] for r in rounds if r.get("write_s")]),
        "written_mb": summarize([r["written_mb"] for r in rounds if r.get("write_s")]),
        "cached_tokens": summarize([r["cached_tokens"] for r in rounds]),
        "prompt_tokens": summarize([r["prompt_tokens"] for r in rounds]),
    }


def memory_summary(floods: list[dict]) -> dict:
    """Per flood: how much resident memory grew (from the idle worker) against what the cache counts."""
    out = {}
    for f in floods:
        after = f["after"]
        base = f["idle_rss_mib"]
        out[f["build"]] = {
            "prompts": len(after),
            "rss_growth_mib": [round(a["rss_mib"] - base, 1) for a in after],
            "peak_growth_mib": [round(a["hwm_mib"] - base, 1) for a in after],
            "gauge_mib": [round(a["gauge_mib"], 1) for a in after],
            "growth_per_prompt_mib": summarize([b["rss_mib"] - a["rss_mib"] for a, b in zip(after, after[1:])]),
            "growth_over_gauge": (after[-1]["rss_mib"] - base) / after[-1]["gauge_mib"] if after and after[-1]["gauge_mib"] else None,
        }
    return out


def format_lines(report: dict) -> list[str]:
    s = report["summary"]
    lines = [f"{report['rounds']} rounds (+{report['warmup']} warm-up discarded), {TURNS} turns, prompts "
             f"{report.get('prompt_tokens', '?')} tokens, servers alternated"]
    for server, v in s.items():
        if server in OWN_WORKERS or not any(v[k]["n"] for k in ("turn1_ttft_s", "shared_ttft_s", "concurrent_ttft_s")):
            continue
        lines.append(f"{server}")
        lines.append(f"  turn 1 TTFT      {fmt(v['turn1_ttft_s'], ' s', 3)}")
        lines.append(f"  turns 2+ TTFT    {fmt(v['later_ttft_s'], ' s', 3)}   (/ own turn 1: {fmt(v['later_over_turn1'], 'x', 3)})")
        for mode, t in v.get("thinking", {}).items():
            lines.append(f"  thinking {mode:<3}: turn 1 {fmt(t['turn1_ttft_s'], ' s', 3)}, turns 2+ {fmt(t['later_ttft_s'], ' s', 3)} "
                         f"(/ own turn 1: {fmt(t['later_over_turn1'], 'x', 3)})")
        lines.append(f"  shared system    {fmt(v['shared_ttft_s'], ' s', 3)}   (/ first conversation: {fmt(v['shared_over_first'], 'x', 3)})")
        lines.append(f"  4 clients TTFT   {fmt(v['concurrent_ttft_s'], ' s', 3)}")
        if "prefill_itl" in v:
            p = v["prefill_itl"]
            lines.append(f"  ITL beside a 2,000-token prefill: median {fmt(p['median_s'], ' s', 3)}, p99 {fmt(p['p99_s'], ' s', 3)}, "
                         f"p99/median {fmt(p['p99_over_median'], 'x', 2)}; outside it median {fmt(p['outside_median_s'], ' s', 3)}")
    a, b = s.get(SERVERS[0]), s.get(SERVERS[1])
    if a and b and any(a[k]["n"] for k in ("turn1_ttft_s", "shared_ttft_s", "concurrent_ttft_s")):
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
        for v in ("memory", "disk"):
            lines.append(f"a row's gaps beside a spilling flood, {v}: median {fmt(sp[v]['median_s'], ' s', 3)}, p99 {fmt(sp[v]['p99_s'], ' s', 3)}"
                         f" ({fmt(sp[v]['disk_writes'], '', 0)} disk writes)")
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
    """Gaps between a stream's chunk arrival `times` that end inside [start, end], and those outside."""
    return itl_windows(times, [(start, end)])


def itl_windows(times: list[float], windows: list[tuple[float, float]]) -> dict:
    """Gaps between a stream's chunk arrival `times` that end inside any of `windows`, and those outside."""
    gaps = [(b, b - a, any(s <= b <= e for s, e in windows)) for a, b in zip(times, times[1:])]
    inside = sorted(g for _, g, within in gaps if within)
    outside = [g for _, g, within in gaps if not within]
    if not inside:
        return {"median_s": None, "p99_s": None, "n": 0}
    p99 = inside[min(len(inside) - 1, round(0.99 * (len(inside) - 1)))]
    return {"median_s": statistics.median(inside), "p99_s": p99, "max_s": inside[-1], "n": len(inside),
            "outside_median_s": statistics.median(outside) if outside else None}


# -- measurement -----------------------------------------------------------------------


async def conversation_turns(url, model, system: str, thinking: bool, tag: str) -> tuple[list[float], list[int]]:
    """A `TURNS`-turn conversation fed its answers (the template's thinking `thinking`): each turn's
    time to first token and prompt tokens."""
    extra = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": thinking}}
    sessions = [conversation(0, system, "what is failing?", TURNS)]
    rows = answered(await run_sessions(url + "/v1", model, sessions, ANSWER_TOKENS, labels={}, tag=tag, extra=extra))
    return [r["ttft_s"] for r in rows], [r["prompt_tokens"] for r in rows]


async def shared(session, url, model, system: str) -> tuple[float, float]:
    first = await stream_chat(session, url, model, [{"role": "system", "content": system},
                                                    {"role": "user", "content": "what is failing?"}], 8)
    other = await stream_chat(session, url, model, [{"role": "system", "content": system},
                                                    {"role": "user", "content": "which file is largest?"}], 8)
    return other["ttft_s"], first["ttft_s"]


async def concurrent(session, url, model, round_no: int, tools: int) -> float:
    runs = await asyncio.gather(*(stream_chat(session, url, model, [{"role": "user", "content": f"client {c}. " + system_prompt(round_no * 10 + c, tools // 4)}], 16)
                                  for c in range(4)))
    return statistics.median(r["ttft_s"] for r in runs)


async def stream_completion(session, url: str, model: str, prompt: str, max_tokens: int, times: list, ignore_eos: bool = False) -> None:
    """A plain completion streamed, each chunk's arrival time in `times` (no chat-output splitter holds text back)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            **({"ignore_eos": True} if ignore_eos else {})}
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                if any(c.get("text") for c in json.loads(line[6:]).get("choices") or []):
                    times.append(time.perf_counter())


async def prefill_itl(session, url, model, round_no: int, tools: int) -> dict:
    times: list[float] = []
    decoding = await decoding_row(session, url, model, f"round {round_no}", times, 400, ignore_eos=False)
    long = await stream_chat(session, url, model, [{"role": "user", "content": system_prompt(1000 + round_no, tools)}], 4)
    await decoding
    return itl_window(times, long["sent"], long["first"])


def native_worker(target: Path, head: Path, depth: int, logdir: Path, name: str, *, program: str | None = None,
                  cache_dir: Path | None = None, cache_gib: float | None = None):
    """One native worker with the MTP head at the default prefix-cache budget, started and healthy
    (`cache_dir`: its disk tier's directory; `program`: another build's `mtpstack`)."""
    from mtpstack.runtime import Process, free_port, url_of
    from mtpstack.validator import WorkerProfile, worker_argv
    from mtpstack.worker.launcher import resolve_command, worker_env

    port = free_port()
    profile = WorkerProfile.model_validate({
        "model": "bench", "backend": "native", "target": {"path": str(target), "bits": "fp32"},
        "drafter": {"path": str(head), "bits": "fp32", "depth": depth, "kind": "mtp"}, "maxNumSeqs": 2, "port": port,
        "prefixCache": {"dir": str(cache_dir) if cache_dir else None, **({"maxGiB": cache_gib} if cache_gib is not None else {})},
    })
    argv = resolve_command(worker_argv(profile))
    if program:
        argv = [program, *argv[argv.index("worker"):]]
    proc = Process(argv, log_path=logdir / f"{name}.log", name=name, kind="worker", url=url_of("127.0.0.1", port), env=worker_env())
    proc.start()
    try:
        proc.wait_ready("/health", 300, state="healthy")
    except Exception:
        proc.stop()
        raise
    return proc


def tier_writes(log_path: Path) -> dict:
    """A stopped worker's disk-tier writes, from the last line its tier logged when it stopped ({}: none)."""
    found = list(TIER_STOPS.finditer(log_path.read_text(errors="replace"))) if log_path.exists() else []
    if not found:
        return {}
    writes, mb, seconds, sync = found[-1].groups()
    return {"writes": int(writes), "written_mb": float(mb), "write_s": float(seconds), "sync_s": float(sync)}


def scrape(url: str, names: list[str]) -> dict[str, float]:
    import urllib.request

    from mtpstack.proxy.prometheus import unlabelled

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        return unlabelled(resp.read().decode(), names)


async def restart_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """One conversation's first turn, a restart on the disk tier, its next turn; then that next turn
    on a fresh worker with nothing cached (the cold prefill), the order alternating by round."""
    from mtpstack import series

    names = [series.PREFIX_CACHE_DISK_READ_BYTES, series.PREFIX_CACHE_DISK_RESTORE_SECONDS + "_sum"]
    cache = workdir / f"restart-cache-{rnd}"
    messages = [{"role": "system", "content": system_prompt(500 + rnd, args.tools)}, {"role": "user", "content": "what is failing?"}]
    w = native_worker(target, head, args.depth, workdir, f"restart-{rnd}-a", cache_dir=cache)
    try:
        first = await stream_chat(session, w.url, "bench", messages, ANSWER_TOKENS)
    finally:
        w.stop()  # SIGTERM: the worker finishes its queued writes within its grace
    writes = tier_writes(w.log_path)
    messages = messages + [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": FOLLOW_UPS[0]}]

    async def restarted() -> dict:
        w = native_worker(target, head, args.depth, workdir, f"restart-{rnd}-b", cache_dir=cache)
        try:
            before = scrape(w.url, names)
            r = await stream_chat(session, w.url, "bench", messages, ANSWER_TOKENS)
            after = scrape(w.url, names)
        finally:
            w.stop()
        return {"ttft": r["ttft_s"], "usage": r["usage"], "read_bytes": after[names[0]] - before[names[0]],
                "restore_s": after[names[1]] - before[names[1]]}

    async def cold() -> float:
        w = native_worker(target, head, args.depth, workdir, f"restart-{rnd}-cold", cache_dir=workdir / f"cold-cache-{rnd}")
        try:
            return (await stream_chat(session, w.url, "bench", messages, ANSWER_TOKENS))["ttft_s"]
        finally:
            w.stop()

    if rnd % 2:
        cold_s, hot = await cold(), await restarted()
    else:
        hot, cold_s = await restarted(), await cold()
    usage = hot["usage"]
    return {"restart_ttft_s": hot["ttft"], "cold_ttft_s": cold_s, "read_bytes": hot["read_bytes"], "restore_s": hot["restore_s"], **writes,
            "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


async def decoding_row(session, url: str, model: str, label: str, times: list, tokens: int = 4000,
                       ignore_eos: bool = True) -> asyncio.Task:
    """A streaming row (`tokens` tokens, its chunks' times in `times`) that has decoded its first 20,
    before anything is sent beside it."""
    prompt = f"# {label}\nimport os\n"
    decoding = asyncio.create_task(stream_completion(session, url, model, prompt, tokens, times, ignore_eos))
    while len(times) < 20:
        if decoding.done():  # failed, or the model ended its answer: no decoding row to measure beside
            await decoding
            raise RuntimeError(f"{url}: the decoding row ended after {len(times)} tokens")
        await asyncio.sleep(0.01)
    return decoding


async def stopped(decoding: asyncio.Task) -> None:
    decoding.cancel()
    try:
        await decoding
    except (asyncio.CancelledError, Exception):
        pass


async def restore_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """A decoding row's gaps while a prompt is restored from disk beside it `--restores` times, for this
    checkout and `--baseline` (each on a copy of one primed directory), the order alternating by round."""
    from mtpstack import series

    names = [series.PREFIX_CACHE_DISK_HITS, series.PREFIX_CACHE_DISK_READ_BYTES, series.PREFIX_CACHE_DISK_RESTORE_SECONDS + "_sum"]
    messages = [{"role": "system", "content": system_prompt(900 + rnd, args.tools)}, {"role": "user", "content": "what is failing?"}]
    primed = workdir / f"restore-primed-{rnd}"
    w = native_worker(target, head, args.depth, workdir, f"restore-{rnd}-prime", cache_gib=SPILL_GIB, cache_dir=primed)
    try:
        await stream_chat(session, w.url, "bench", messages, 1)
    finally:
        w.stop()  # its writes finished: the snapshots are on disk
    builds = {"this checkout": None, **({"baseline": args.baseline} if args.baseline else {})}
    out = {}
    for b, build in enumerate(list(builds) if rnd % 2 == 0 else list(builds)[::-1]):
        cache = Path(shutil.copytree(primed, workdir / f"restore-{rnd}-{b}"))
        w = native_worker(target, head, args.depth, workdir, f"restore-{rnd}-{b}", program=builds[build], cache_gib=SPILL_GIB,
                          cache_dir=cache)
        try:
            times: list[float] = []
            decoding = await decoding_row(session, w.url, "bench", f"restore {rnd}", times)
            before, windows = scrape(w.url, names), []
            for _ in range(args.restores):
                r = await stream_chat(session, w.url, "bench", messages, 1)
                windows.append((r["sent"], r["first"]))
            after = scrape(w.url, names)
            await stopped(decoding)
        finally:
            w.stop()
        hits = after[names[0]] - before[names[0]]
        out[build] = {**itl_windows(times, windows), "disk_hits": hits, "read_mb": (after[names[1]] - before[names[1]]) / 1e6 / max(hits, 1),
                      "restore_s": (after[names[2]] - before[names[2]]) / max(hits, 1)}
    return out


def restore_summary(rounds: list[dict]) -> dict:
    builds = [b for b in rounds[0]] if rounds else []
    out = {b: {k: summarize([r[b][k] for r in rounds if r[b].get(k) is not None])
               for k in ("median_s", "p99_s", "max_s", "outside_median_s", "disk_hits", "read_mb", "restore_s")} for b in builds}
    for b in builds:
        out[b]["inside_over_outside"] = summarize([r[b]["median_s"] / r[b]["outside_median_s"] for r in rounds
                                                   if r[b].get("median_s") and r[b].get("outside_median_s")])
    return out


async def spill_round(session, target: Path, head: Path, args, workdir: Path, rnd: int) -> dict:
    """The decoding row's gaps while the flood arrives: memory only, and with a disk tier."""
    from mtpstack import series

    out = {}
    for variant in (["memory", "disk"] if rnd % 2 == 0 else ["disk", "memory"]):
        w = native_worker(target, head, args.depth, workdir, f"spill-{rnd}-{variant}", cache_gib=SPILL_GIB,
                          cache_dir=workdir / f"spill-cache-{rnd}" if variant == "disk" else None)
        try:
            times: list[float] = []
            decoding = await decoding_row(session, w.url, "bench", f"spill {rnd}", times)
            start = time.perf_counter()
            for i in range(args.spill_prompts):
                await stream_chat(session, w.url, "bench", [{"role": "user", "content": system_prompt(700 + rnd * 50 + i, args.tools // 2)}], 1)
            end = time.perf_counter()
            await stopped(decoding)
            writes = scrape(w.url, [series.PREFIX_CACHE_DISK_WRITES, series.PREFIX_CACHE_EVICTIONS])
        finally:
            w.stop()
        out[variant] = {**itl_window(times, start, end), "disk_writes": writes[series.PREFIX_CACHE_DISK_WRITES],
                        "evictions": writes[series.PREFIX_CACHE_EVICTIONS]}
    return out


def spill_summary(rounds: list[dict]) -> dict:
    out = {v: {"median_s": summarize([r[v]["median_s"] for r in rounds if r[v]["median_s"]]),
               "p99_s": summarize([r[v]["p99_s"] for r in rounds if r[v]["p99_s"]]),
               "disk_writes": summarize([r[v]["disk_writes"] for r in rounds])} for v in ("memory", "disk")}
    out["p99_disk_over_memory"] = summarize([r["disk"]["p99_s"] / r["memory"]["p99_s"] for r in rounds
                                             if r["disk"]["p99_s"] and r["memory"]["p99_s"]])
    return out


def status_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_flood(head: Path, args, workdir: Path, build: str, program: str | None) -> dict:
    """`--flood` distinct prompts of `--flood-tokens` token ids, one after another, into one worker of
    the shipped demo pair at the default budget; resident memory and the gauge after each."""
    import json as _json
    import random
    import urllib.request

    from mtpstack import series
    from mtpstack.worker.demo import DEMO_TARGET

    w = native_worker(Path(DEMO_TARGET), head, args.depth, workdir, f"memory-{build}", program=program)
    rng = random.Random(11)
    after = []
    try:
        idle = status_mib(w.pid, "VmRSS")
        for i in range(args.flood):
            prompt = [rng.randrange(3, 1000) for _ in range(args.flood_tokens)]
            req = urllib.request.Request(w.url + "/v1/completions", data=_json.dumps(
                {"prompt": prompt, "max_tokens": 1, "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:
                resp.read()
            gauge = scrape(w.url, [series.PREFIX_CACHE_BYTES])[series.PREFIX_CACHE_BYTES] / 2**20
            after.append({"rss_mib": status_mib(w.pid, "VmRSS"), "hwm_mib": status_mib(w.pid, "VmHWM"), "gauge_mib": gauge})
            print(f"memory {build}: prompt {i + 1}: resident +{after[-1]['rss_mib'] - idle:.0f} MiB, the cache counts "
                  f"{gauge:.0f} MiB", file=sys.stderr)
    finally:
        w.stop()
    return {"build": build, "idle_rss_mib": idle, "after": after}


async def run(args) -> dict:
    import aiohttp

    workdir = Path(tempfile.mkdtemp(prefix="agent-bench-"))
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    if args.quick:
        target, source = Path(shutil.copytree(DEMO_TARGET, workdir / "target")), "the shipped demo pair"
    else:
        from devkit.demo.widen import widen

        target = Path(widen(DEMO_TARGET, workdir / "wide-target", mlp_multiplier=args.mlp_multiplier, extra_layers=args.extra_layers))
        source = f"the demo pair, target widened (mlp x{args.mlp_multiplier}, +{args.extra_layers} zero layers)"
    longer_context(target, CONTEXT)
    source += f", context raised to {CONTEXT} tokens (a speed measurement: text past the trained length is not judged)"
    print(f"models: {source}", file=sys.stderr)
    on = set(args.only or SCENARIOS)
    samples: dict = {name: {"turns": [], "turns_by_thinking": {}, "shared": [], "concurrent": [], "prefill_itl": []} for name in SERVERS}
    prompt_tokens = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as session:
        if on - OWN_WORKERS:
            prompt_tokens = await shared_servers(session, args, target, workdir, on, samples)
        for scenario, label, one_round in (("restart", "restart", restart_round), ("spill_itl", "spill", spill_round),
                                           ("restore_itl", "restore", restore_round)):
            if scenario not in on:
                continue
            samples[scenario] = []
            for rnd in range(args.warmup + args.rounds):
                r = await one_round(session, target, DEMO_HEAD, args, workdir, rnd)
                print(f"{label} round {rnd}{'' if rnd >= args.warmup else ' (warm-up)'}: {r}", file=sys.stderr)
                if rnd >= args.warmup:
                    samples[scenario].append(r)
    if "memory" in on:
        samples["memory"] = [memory_flood(DEMO_HEAD, args, workdir, "this checkout", None)]
        if args.baseline:
            samples["memory"].append(memory_flood(DEMO_HEAD, args, workdir, "baseline", args.baseline))
    summary = summarize_samples(samples)
    summary.update({name: of(samples[name]) for name, of in (("restart", restart_summary), ("memory", memory_summary),
                                                              ("spill_itl", spill_summary), ("restore_itl", restore_summary))
                    if samples.get(name)})
    return {"source": source, "rounds": args.rounds, "warmup": args.warmup, "depth": args.depth, "tools": args.tools,
            "prompt_tokens": prompt_tokens, "samples": samples, "summary": summary}


async def shared_servers(session, args, target: Path, workdir: Path, on: set, samples: dict) -> str | None:
    """The scenarios on the two servers, started once and used alternately; the turns' prompt sizes."""
    from mtpstack.worker.demo import DEMO_HEAD

    servers = start_servers(target, DEMO_HEAD, args.depth, workdir, SERVERS)
    models = {"native+mtp": "bench", "mlx_lm.server": str(target)}
    prompt_tokens = None
    try:
        for rnd in range(args.warmup + args.rounds):
            order = SERVERS if rnd % 2 == 0 else SERVERS[::-1]
            keep = rnd >= args.warmup
            for name in order:
                url, model = servers[name].url, models[name]
                seed = rnd * 2 + SERVERS.index(name)  # every server and round its own system prompt
                ttfts, tokens, by_mode = [], [], {}
                if "turns" in on:
                    for m, mode in enumerate(args.thinking):
                        system = system_prompt(seed * 10 + m, args.tools)
                        tag = f"agent-{rnd}-{name}-{mode}"
                        by_mode[mode] = await conversation_turns(url, model, system, THINKING[mode], tag)
                    ttfts, tokens = by_mode[args.thinking[0]]
                other = await shared(session, url, model, system_prompt(100 + seed, args.tools)) if "shared" in on else None
                conc = await concurrent(session, url, model, 200 + seed, args.tools) if "concurrent" in on else None
                itl = await prefill_itl(session, url, model, seed, args.tools) if name == "native+mtp" and "prefill_itl" in on else None
                print(f"round {rnd}{'' if keep else ' (warm-up)'} {name}: turns {[round(t, 3) for t in ttfts]} "
                      f"shared {other} 4-clients {conc}"
                      + (f" itl median {itl['median_s']} p99 {itl['p99_s']}" if itl else ""), file=sys.stderr)
                if keep:
                    for key, value in (("turns", ttfts), ("shared", other), ("concurrent", conc)):
                        if value:
                            samples[name][key].append(value)
                    for mode, (t, _) in by_mode.items():
                        samples[name]["turns_by_thinking"].setdefault(mode, []).append(t)
                    if itl and itl["n"]:
                        samples[name]["prefill_itl"].append(itl)
                if tokens:
                    prompt_tokens = prompt_tokens or f"{tokens[0]}-{tokens[-1]}"
    finally:
        for proc in servers.values():
            proc.stop()
    return prompt_tokens


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
