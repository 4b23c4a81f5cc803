"""Long prompts: how fast a fresh one prefills, and what it does to the streams decoding beside it, side by side with the peers.

Every server (the same target, by default the demo pair with its target widened, at batch width 4) is started,
then measured one at a time, the order rotated each round. Per round and server: `cold`, a never-seen prompt
of each `--lengths` (real Python source, the round's tag first), prompt tokens over time to first token, then
the server's peak resident memory; `beside`, 1 and 3 greedy streams decoding while a fresh prompt of the first
length prefills: their rate over their rate on the same tokens alone (`kept`) and just before (`kept_vs_before`),
their longest gap, the prompt's TTFT over its time alone; `warm`, a conversation's next turn after a ~3k-token
file read: its TTFT and the prefix the cache held. Medians with min-max over rounds; the method, and why `kept`
runs the streams again alone: docs/bench.md, "Long prompts".

    python bench/scripts/prefill_bench.py --out bench-prefill.json                 # 8k and 30k, 2 rounds
    python bench/scripts/prefill_bench.py --lengths 8192 --rounds 3 --configs native+mtp mlx_lm.server
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import json
import time
from pathlib import Path

from mtpstack.bench.load import memory_kib
from mtpstack.bench.parts import (check_models, emit, ensure_preload, fmt, longer_context, model_options,
                                  prepared_pair, rotated, rounds, run_meta, spread)
from mtpstack.bench.servers import CONFIGS, REQUEST_TIMEOUT, served_model, start_servers, stream_chat

DEFAULT_CONFIGS = ["native+mtp", "native", "mlx_lm.server", "mlx-vlm+mtp"]
#: Streams decoding while the long prompt arrives: widths 2 and 4 with it.
DECODERS = (1, 3)
#: Tokens a decoding stream asks for (it is cancelled at the long prompt's first token): 1,500 ran out during an
#: 8k prefill (38% of 35 tok/s for 95 s), and a stream that ends early is left out of `kept`.
STREAM_TOKENS = 6000
#: Seconds of a stream's own pace measured before the long prompt is sent.
ALONE_SECONDS = 3.0


def source_text(tokenizer, tokens: int, tag: str) -> str:
    """`tokens` tokens of real Python source (the standard library's, as an agent reads files), `tag` first."""
    import sysconfig

    words, have = [tag], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(errors="replace")
        words.append(f"\n# file: {path.name}\n{text}")
        have += len(tokenizer.encode(text))
        if have > tokens * 1.2:
            break
    ids = tokenizer.encode("".join(words))[:tokens]
    return tokenizer.decode(ids)


class Counted:
    """A stream's text as it arrives, counted in tokens: (arrival time, tokens so far) per chunk."""

    def __init__(self, tokenizer):
        self.tokenizer, self.text, self.marks = tokenizer, "", []
        self.ended: float | None = None  # when the stream ended by itself (not cancelled)

    def add(self, piece: str, now: float) -> None:
        self.text += piece
        self.marks.append((now, len(self.tokenizer.encode(self.text))))

    def rate(self, start: float, end: float) -> float | None:
        inside = [(t, n) for t, n in self.marks if start <= t <= end]
        before = [n for t, n in self.marks if t < start]
        if not inside:
            return 0.0 if self.marks and self.marks[-1][0] >= end else None
        return (inside[-1][1] - (before[-1] if before else inside[0][1])) / (end - start)

    def count_at(self, when: float) -> int:
        return max((n for t, n in self.marks if t <= when), default=0)

    def time_at(self, tokens: int) -> float | None:
        """When the stream first had `tokens` tokens (None: never)."""
        return next((t for t, n in self.marks if n >= tokens), None)

    def longest_gap(self, start: float, end: float) -> float:
        times = [start] + [t for t, _ in self.marks if start < t < end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))


def end_of_turn_bias(target: Path) -> dict:
    """`logit_bias` that keeps the target's end-of-turn tokens (config.json's `eos_token_id`) from being chosen."""
    config = json.loads((target / "config.json").read_text())
    ids = config.get("eos_token_id", (config.get("text_config") or {}).get("eos_token_id"))
    ids = ids if isinstance(ids, list) else [ids]
    return {"logit_bias": {str(i): -100 for i in ids if isinstance(i, int)}}


async def cold(session, proc, model, tokenizer, lengths, tag) -> dict:
    out = {}
    for n in lengths:
        r = await stream_chat(session, proc.url, model, [{"role": "user", "content": source_text(tokenizer, n, f"{tag} {n}")}], 1)
        prompt = r["usage"].get("prompt_tokens") or n
        out[str(n)] = {"ttft_s": r["ttft_s"], "prompt_tokens": prompt, "tok_s": prompt / r["ttft_s"]}
    peak_kib = memory_kib(proc.pid).get("VmHWM")
    out["peak_mib"] = peak_kib / 1024 if peak_kib is not None else None
    return out


async def decoders_running(session, proc, model, tokenizer, decoders, tag, never_end):
    """`decoders` greedy streams, each past its first few chunks, kept from their end of turn (`ignore_eos`, or
    for the peers `never_end`'s `logit_bias`): (their counts, their tasks)."""
    streams = [Counted(tokenizer) for _ in range(decoders)]

    async def decode(i: int, counted: Counted) -> None:
        messages = [{"role": "user", "content": f"{tag} stream {i}: write a long Python module.\n"}]
        await stream_chat(session, proc.url, model, messages, STREAM_TOKENS, on_content=counted.add, extra=never_end)
        counted.ended = time.perf_counter()

    tasks = [asyncio.create_task(decode(i, c)) for i, c in enumerate(streams)]
    deadline = time.perf_counter() + 120
    while any(len(c.marks) < 5 for c in streams) and time.perf_counter() < deadline and not all(t.done() for t in tasks):
        await asyncio.sleep(0.05)
    return streams, tasks


async def stopped(tasks) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def beside(session, proc, model, tokenizer, length, decoders, tag, alone_ttft, never_end) -> dict:
    streams, tasks = await decoders_running(session, proc, model, tokenizer, decoders, tag, never_end)
    await asyncio.sleep(ALONE_SECONDS)
    sent = time.perf_counter()
    long = await stream_chat(session, proc.url, model, [{"role": "user", "content": source_text(tokenizer, length, f"{tag} long")}], 1)
    first = long["first"]
    await stopped(tasks)
    spans = [(c.count_at(sent), c.count_at(first)) for c in streams]
    # The same streams again, alone, to the counts they reached: their rate on the tokens decoded beside the prompt.
    control, tasks = await decoders_running(session, proc, model, tokenizer, decoders, tag, never_end)
    deadline = time.perf_counter() + 4 * (first - sent) + 60
    while any(c.count_at(time.perf_counter()) < end and c.ended is None for c, (_, end) in zip(control, spans)) \
            and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    await stopped(tasks)
    rows = []
    for c, alone_c, (start, end) in zip(streams, control, spans):
        during = c.rate(sent, first)
        t0, t1 = alone_c.time_at(start), alone_c.time_at(end)
        alone = (end - start) / (t1 - t0) if t0 is not None and t1 is not None and t1 > t0 else None
        before = c.rate(sent - ALONE_SECONDS, sent)
        ended = c.ended is not None and c.ended < first
        rows.append({"alone_tok_s": alone, "before_tok_s": before, "during_tok_s": during, "tokens": [start, end],
                     "kept": during / alone if alone and during is not None else None,
                     "kept_vs_before": during / before if before and during is not None else None,
                     "longest_gap_s": c.longest_gap(sent, first), "ended_early": ended})
    return {"streams": rows, "long_ttft_s": long["ttft_s"], "ttft_ratio": long["ttft_s"] / alone_ttft if alone_ttft else None}


async def warm_turn(session, proc, model, tokenizer, tag, tokens) -> dict:
    messages = [{"role": "system", "content": "You are a coding agent. Answer briefly."},
                {"role": "user", "content": "Read this file and say what it does:\n" + source_text(tokenizer, tokens, tag)}]
    first = await stream_chat(session, proc.url, model, messages, 16)
    messages += [{"role": "assistant", "content": first["text"] or "It defines helpers."},
                 {"role": "user", "content": source_text(tokenizer, 100, "Now explain the first function, and")}]
    second = await stream_chat(session, proc.url, model, messages, 16)
    cached = (second["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"first_ttft_s": first["ttft_s"], "ttft_s": second["ttft_s"], "prompt_tokens": second["usage"].get("prompt_tokens"),
            "cached_tokens": cached}


async def run(args) -> dict:
    import aiohttp
    from transformers import AutoTokenizer

    workdir, target, head, source = prepared_pair(args, "prefill-bench-")
    if max(args.lengths) + 64 > 32768:
        longer_context(target, max(args.lengths) + 1024)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    servers = start_servers(target, head, args.depth, workdir, args.configs)
    samples: dict = {name: [] for name in args.configs}
    bias = end_of_turn_bias(target)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT * 3)) as session:
            warm_up = [{"role": "user", "content": source_text(tokenizer, 600, "warm-up")}]
            for name, proc in servers.items():  # each server's first forwards (compiles, allocations)
                await stream_chat(session, proc.url, served_model(name, target), warm_up, 8)
            for rnd, _ in rounds(0, args.rounds):
                for name in rotated(args.configs, rnd):
                    proc, model, tag = servers[name], served_model(name, target), f"Session {rnd}-{name}."
                    r = {"cold": await cold(session, proc, model, tokenizer, args.lengths, tag)}
                    alone = r["cold"][str(args.lengths[0])]["ttft_s"]
                    never_end = {} if CONFIGS[name][0] == "native" else bias
                    if "beside" in args.only:
                        r["beside"] = {str(d): await beside(session, proc, model, tokenizer, args.lengths[0], d, f"{tag} w{d}",
                                                            alone, never_end) for d in DECODERS}
                    if "warm" in args.only:
                        r["warm"] = await warm_turn(session, proc, model, tokenizer, f"{tag} warm", args.warm_tokens)
                    samples[name].append(r)
                    if args.out:  # what is done so far, so a run stopped early keeps it
                        Path(args.out).write_text(json.dumps(report(args, source, samples, done=False), indent=2) + "\n")
    finally:
        for proc in servers.values():
            proc.stop()
    return report(args, source, samples, done=True)


def report(args, source: str, samples: dict, done: bool) -> dict:
    """The JSON report of the `samples` so far; `meta.partial` until every round ran."""
    partial = {} if done else {"partial": True}
    meta = run_meta(models=source, lengths=args.lengths, rounds=args.rounds, depth=args.depth, **partial)
    taken = {name: rows for name, rows in samples.items() if rows}
    return {"meta": meta, "summary": summary(taken, args.lengths), "samples": samples}


def summary(samples: dict, lengths: list[int]) -> dict:
    def decoded(r, d):  # the streams that decoded until the long prompt's first token
        return [x for x in r["beside"][str(d)]["streams"] if not x["ended_early"]]

    out = {}
    for name, runs in samples.items():
        def over(pick) -> dict:
            return spread([v for r in runs for v in pick(r) if v is not None])

        s = {f"prefill_tok_s@{n}": over(lambda r, n=n: [r["cold"][str(n)]["tok_s"]]) for n in lengths}
        s["peak_mib"] = over(lambda r: [r["cold"]["peak_mib"]])
        for d in DECODERS if all("beside" in r for r in runs) else ():
            for key in ("kept", "kept_vs_before", "longest_gap_s"):
                s[f"{key}@{d + 1}"] = over(lambda r, key=key, d=d: [x.get(key) for x in decoded(r, d)])
            s[f"long_ttft_ratio@{d + 1}"] = over(lambda r, d=d: [r["beside"][str(d)]["ttft_ratio"]])
            s[f"ended_early@{d + 1}"] = sum(x["ended_early"] for r in runs for x in r["beside"][str(d)]["streams"])
        if all("warm" in r for r in runs):
            for key in ("ttft_s", "cached_tokens"):
                s[f"warm_{key}"] = over(lambda r, key=key: [r["warm"][key]])
        out[name] = s
    return out


def report_lines(summary: dict) -> list[str]:
    keys = list(next(iter(summary.values())).keys()) if summary else []
    lines = ["| | " + " | ".join(summary) + " |", "|---" * (len(summary) + 1) + "|"]
    for key in keys:
        cells = [str(s[key]) if isinstance(s[key], int) else fmt(s[key], digits=3 if "ratio" in key or "kept" in key else 2)
                 for s in summary.values()]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_options(p)
    p.add_argument("--configs", nargs="+", choices=[c for c in CONFIGS if "@" not in c], default=DEFAULT_CONFIGS)
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 30000], help="cold prompt lengths in tokens (default: 8192 30000)")
    p.add_argument("--warm-tokens", type=int, default=3000, help="the warm turn's file read in tokens (default: 3000)")
    p.add_argument("--only", nargs="+", choices=["cold", "beside", "warm"], default=["cold", "beside", "warm"],
                   help="the parts measured after the cold prefill, which always runs (default: all)")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds (default: 2)")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    args = p.parse_args(argv)
    check_models(p, args)
    ensure_preload()
    result = asyncio.run(run(args))
    return emit(result, report_lines(result["summary"]), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
