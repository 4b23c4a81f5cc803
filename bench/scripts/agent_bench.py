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

    python bench/scripts/agent_bench.py --out bench-agent.json        # the demo pair, target widened to ~70M
    python bench/scripts/agent_bench.py --quick                        # the shipped demo as it is, 1 round

Raw samples and summaries go to stdout (or --out) as JSON; a readable table to stderr.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from worker_bench import ensure_preload, fmt, start_servers, stream_chat, summarize

SERVERS = ["native+mtp", "mlx_lm.server"]
SCENARIOS = ["turns", "shared", "concurrent", "prefill_itl"]
TURNS = 6
ANSWER_TOKENS = 32
FOLLOW_UPS = ["open the failing test", "show me line 40", "fix the off-by-one", "run the tests again",
              "commit it", "summarize what changed"]
REQUEST_TIMEOUT = 900
#: The context both servers are given (see `longer_context`).
CONTEXT = 8192


def system_prompt(round_no: int, tools: int) -> str:
    """A coding agent's system prompt with `tools` tool lines; the round number first, so no round hits another's cache."""
    lines = [f"Session {round_no}. You are a coding agent working in a repository. Use the tools below; answer briefly."]
    for i in range(tools):
        lines.append(f"- tool_{i}(path: str, start: int = 0, end: int | None = None) -> str: read, search or edit "
                     f"the file at `path` between the given lines and return the result as plain text ({i}).")
    return "\n".join(lines)


def longer_context(target: Path, tokens: int) -> None:
    """The demo is trained on 512-token windows; an agent's prompt is longer. RoPE runs past it unchanged."""
    path = target / "config.json"
    config = json.loads(path.read_text())
    for section in (config, config.get("text_config") or {}):
        if "max_position_embeddings" in section:
            section["max_position_embeddings"] = tokens
    path.write_text(json.dumps(config, indent=1))


def ratio(a, b):
    return a / b if a and b else None


# -- pure summaries (unit-testable) ------------------------------------------------------


def summarize_samples(samples: dict) -> dict:
    """Raw samples -> medians with min-max, per server and scenario."""
    out: dict = {}
    for server, s in samples.items():
        turns = s.get("turns", [])
        later = [t for conv in turns for t in conv[1:]]
        first = [conv[0] for conv in turns if conv]
        out[server] = {
            "turn1_ttft_s": summarize(first),
            "later_ttft_s": summarize(later),
            "later_over_turn1": summarize([statistics.median(conv[1:]) / conv[0] for conv in turns if len(conv) > 1 and conv[0]]),
            "per_turn_ttft_s": [summarize([conv[i] for conv in turns if len(conv) > i]) for i in range(max(map(len, turns), default=0))],
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


def format_lines(report: dict) -> list[str]:
    s = report["summary"]
    lines = [f"{report['rounds']} rounds (+{report['warmup']} warm-up discarded), {TURNS} turns, prompts "
             f"{report.get('prompt_tokens', '?')} tokens, servers alternated"]
    for server, v in s.items():
        lines.append(f"{server}")
        lines.append(f"  turn 1 TTFT      {fmt(v['turn1_ttft_s'], ' s', 3)}")
        lines.append(f"  turns 2+ TTFT    {fmt(v['later_ttft_s'], ' s', 3)}   (/ own turn 1: {fmt(v['later_over_turn1'], 'x', 3)})")
        lines.append(f"  shared system    {fmt(v['shared_ttft_s'], ' s', 3)}   (/ first conversation: {fmt(v['shared_over_first'], 'x', 3)})")
        lines.append(f"  4 clients TTFT   {fmt(v['concurrent_ttft_s'], ' s', 3)}")
        if "prefill_itl" in v:
            p = v["prefill_itl"]
            lines.append(f"  ITL beside a 2,000-token prefill: median {fmt(p['median_s'], ' s', 3)}, p99 {fmt(p['p99_s'], ' s', 3)}, "
                         f"p99/median {fmt(p['p99_over_median'], 'x', 2)}; outside it median {fmt(p['outside_median_s'], ' s', 3)}")
    a, b = s.get(SERVERS[0]), s.get(SERVERS[1])
    if a and b:
        for key, name in (("later_ttft_s", "turns 2+ TTFT"), ("shared_ttft_s", "shared-system TTFT"), ("concurrent_ttft_s", "4-client TTFT")):
            r = ratio(a[key]["median"], b[key]["median"])
            lines.append(f"{name}: {SERVERS[0]} / {SERVERS[1]} = {r:.2f}x" if r else f"{name}: n/a")
    return lines


def itl_window(times: list[float], start: float, end: float) -> dict:
    """Gaps between a stream's chunk arrival `times` that end inside [start, end], and those outside."""
    gaps = [(b, b - a) for a, b in zip(times, times[1:])]
    inside = sorted(g for t, g in gaps if start <= t <= end)
    outside = [g for t, g in gaps if not start <= t <= end]
    if not inside:
        return {"median_s": None, "p99_s": None, "n": 0}
    p99 = inside[min(len(inside) - 1, round(0.99 * (len(inside) - 1)))]
    return {"median_s": statistics.median(inside), "p99_s": p99, "n": len(inside),
            "outside_median_s": statistics.median(outside) if outside else None}


# -- measurement -----------------------------------------------------------------------


async def conversation(session, url, model, system: str, turns: int) -> tuple[list[float], list[int]]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "what is failing?"}]
    ttfts, prompt_tokens = [], []
    for i in range(turns):
        r = await stream_chat(session, url, model, messages, ANSWER_TOKENS)
        ttfts.append(r["ttft_s"])
        prompt_tokens.append(r["usage"].get("prompt_tokens"))
        messages += [{"role": "assistant", "content": r["text"]}, {"role": "user", "content": FOLLOW_UPS[i % len(FOLLOW_UPS)]}]
    return ttfts, prompt_tokens


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


async def stream_completion(session, url: str, model: str, prompt: str, max_tokens: int, times: list) -> None:
    """A plain completion streamed, each chunk's arrival time in `times` (no chat-output splitter holds text back)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                if any(c.get("text") for c in json.loads(line[6:]).get("choices") or []):
                    times.append(time.perf_counter())


async def prefill_itl(session, url, model, round_no: int, tools: int) -> dict:
    times: list[float] = []
    decoding = asyncio.create_task(stream_completion(session, url, model, f"# round {round_no}\nimport os\n", 400, times))
    while len(times) < 20:  # the row decodes before the long prompt arrives
        if decoding.done():  # failed, or the model ended its answer: no decoding row to measure beside
            await decoding
            raise RuntimeError(f"{url}: the decoding row ended after {len(times)} tokens, before the long prompt was sent")
        await asyncio.sleep(0.01)
    long = await stream_chat(session, url, model, [{"role": "user", "content": system_prompt(1000 + round_no, tools)}], 4)
    await decoding
    return itl_window(times, long["sent"], long["first"])


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
    servers = start_servers(target, DEMO_HEAD, args.depth, workdir, SERVERS)
    models = {"native+mtp": "bench", "mlx_lm.server": str(target)}
    samples = {name: {"turns": [], "shared": [], "concurrent": [], "prefill_itl": []} for name in SERVERS}
    prompt_tokens = None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as session:
            for rnd in range(args.warmup + args.rounds):
                order = SERVERS if rnd % 2 == 0 else SERVERS[::-1]
                keep = rnd >= args.warmup
                for name in order:
                    url, model = servers[name].url, models[name]
                    seed = rnd * 2 + SERVERS.index(name)  # every server and round its own system prompt
                    on = set(args.only or SCENARIOS)
                    ttfts, tokens = await conversation(session, url, model, system_prompt(seed, args.tools), TURNS) if "turns" in on else ([], [])
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
                        if itl and itl["n"]:
                            samples[name]["prefill_itl"].append(itl)
                    if tokens:
                        prompt_tokens = prompt_tokens or f"{tokens[0]}-{tokens[-1]}"
    finally:
        for proc in servers.values():
            proc.stop()
    return {"source": source, "rounds": args.rounds, "warmup": args.warmup, "depth": args.depth, "tools": args.tools,
            "prompt_tokens": prompt_tokens, "samples": samples, "summary": summarize_samples(samples)}


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
    p.add_argument("--out", help="write the JSON report here instead of stdout")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.tools = 1, 0, 12
    ensure_preload()
    report = asyncio.run(run(args))
    print("\n".join(format_lines(report)), file=sys.stderr)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
