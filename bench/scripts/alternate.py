"""An alternated run against one live worker, for the drift correlation `mtpstack bench simulate --rho-from` reads.

Two depths a request can carry (`num_draft_tokens`, up to the worker's own) alternate within one
process, pair by pair in alternating order (AB, BA, AB, ...); each run is one greedy request of fixed
`max_tokens`, timed end to end. The output lists the runs in time order with their tok/s:

    python bench/scripts/alternate.py --url http://127.0.0.1:8101 --depths 0,3 --pairs 20 --out runs.json
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from mtpstack.bench.stats import decide_paired, neighbour_correlation, summarize

PROMPT = "def fibonacci(n):\n"


def one_run(url: str, depth: int, max_tokens: int) -> dict:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "num_draft_tokens": depth}
    req = urllib.request.Request(url.rstrip("/") + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as resp:
        answer = json.loads(resp.read())
    seconds = time.perf_counter() - started
    tokens = answer["usage"]["completion_tokens"]
    return {"config": f"depth {depth}", "tok_s": tokens / seconds, "seconds": seconds, "tokens": tokens,
            "draft_tokens": answer["usage"].get("draft_tokens"), "text": answer["choices"][0]["text"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the worker's base URL")
    p.add_argument("--depths", default="0,3", help="two depths, A,B (default: 0,3)")
    p.add_argument("--pairs", type=int, default=20, help="pairs to run (default: 20)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per run (default: 64)")
    p.add_argument("--out", type=Path, required=True, help="where to write the runs (JSON)")
    args = p.parse_args(argv)
    a, b = (int(x) for x in args.depths.split(","))
    one_run(args.url, a, args.max_tokens)  # warm-up, discarded
    runs = []
    for i in range(args.pairs):
        for depth in ((a, b) if i % 2 == 0 else (b, a)):
            runs.append(one_run(args.url, depth, args.max_tokens))
    texts = {r["config"]: r["text"] for r in runs}
    rho = neighbour_correlation([r["config"] for r in runs], [r["tok_s"] for r in runs])
    base = [r["tok_s"] for r in runs if r["config"] == f"depth {a}"]
    cand = [r["tok_s"] for r in runs if r["config"] == f"depth {b}"]
    verdict = decide_paired(base, cand)
    args.out.write_text(json.dumps({"url": args.url, "depths": [a, b], "pairs": args.pairs, "max_tokens": args.max_tokens,
                                    "identical_text": len(set(texts.values())) == 1, "rho": rho, "runs": runs}, indent=1))
    for label, values in ((f"depth {a}", base), (f"depth {b}", cand)):
        s = summarize(values)
        print(f"{label}: median {s.median:.1f} tok/s, min-max {s.min:.1f}-{s.max:.1f}, n {s.n}")
    print(f"paired ratio depth {b}/depth {a}: {verdict.ratio:.3f} [{verdict.lo:.3f}, {verdict.hi:.3f}] -> {verdict.decision}")
    print(f"drift correlation between neighbouring runs: {rho if rho is None else round(rho, 3)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
