"""The demo target's prompt pass at a long context: a real worker's answer after N tokens against mlx-lm's own.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m devkit.demo.long_context --length 66000 --tokens 8

The prompt is N tokens of the training corpus (code, then prose, as `devkit.demo.corpus` reads it).
The reference is mlx-lm's own forward of the target (`mlx_lm.generate.generate_step`: its chunked
prefill, greedy): the next K tokens and the log-probabilities of each step. The served answer is
a real worker serving the pair as `mtpstack up` does (the target, its MTP head drafting at depth 3,
the prefix cache): `/v1/completions` with the prompt's ids, greedy, K tokens, `logprobs: 5`.

Nothing in the target's forward depends on `max_position_embeddings` (its RoPE is the plain kind on the
full-attention layers; the gated-delta layers have no positions), so the context the config names is the
worker's limit, not a change of the function; this checks that the pass stays correct out there.
Prints both answers and exits 1 unless the tokens are the same and each step's chosen and top
log-probabilities are within `--tolerance` of mlx-lm's."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from devkit.demo import corpus

#: Log-probabilities agree within this (float32 sums over 66k positions in another order, batched
#: attention against mlx-lm's).
TOLERANCE = 2e-3
#: Top log-probabilities compared per step.
TOP = 5


def long_prompt(tokenizer, length: int) -> list[int]:
    """`length` token ids of the corpus: code, then prose, cut at `length`."""
    texts = corpus.sample(corpus.code_texts(), 3 * length) + corpus.sample(corpus.prose_texts(), 3 * length)
    ids = tokenizer.encode("\n".join(texts), add_special_tokens=False)
    if len(ids) < length:
        raise SystemExit(f"the corpus gives {len(ids)} tokens, fewer than {length}")
    return ids[:length]


def reference(target, prompt: list[int], tokens: int) -> tuple[list[int], list[float], list[list[float]]]:
    """mlx-lm's greedy answer: (tokens, the chosen token's log-probability, the top `TOP`), each step."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    out, chosen, tops = [], [], []
    for token, logprobs in generate_step(mx.array(prompt), target, max_tokens=tokens, sampler=lambda lp: mx.argmax(lp, -1)):
        token = int(token)
        out.append(token)
        chosen.append(logprobs[token].item())
        tops.append(sorted(mx.sort(logprobs)[-TOP:].tolist(), reverse=True))
    return out, chosen, tops


def served(prompt: list[int], tokens: int, run_dir: Path) -> dict:
    """The worker's `/v1/completions` answer to `prompt`, greedy, with `logprobs: TOP`."""
    from mtpstack.runtime import Process, free_port, url_of
    from mtpstack.up import default_fleet
    from mtpstack.validator import FleetConfig, worker_argv
    from mtpstack.worker.launcher import resolve_command, worker_env

    data = default_fleet()
    data["workers"]["demo"]["port"] = free_port()
    profile = FleetConfig.model_validate(data).workers["demo"]
    profile = profile.model_copy(update={"prefix_cache": profile.prefix_cache.model_copy(update={"dir": str(run_dir / "cache")})})
    url = url_of(profile.host, profile.port)
    proc = Process(resolve_command(worker_argv(profile)), log_path=run_dir / "worker.log", name="demo", kind="worker",
                   url=url, env=worker_env()).start()
    try:
        proc.wait_ready("/health", 300, state="healthy")
        body = {"model": profile.model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "logprobs": TOP,
                "ignore_eos": True}
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as resp:
            return json.loads(resp.read())
    finally:
        proc.stop()


def compare(tokenizer, ref: tuple, answer: dict, tolerance: float = TOLERANCE) -> list[str]:
    """What differs between mlx-lm's answer and the worker's (empty when they agree)."""
    tokens, chosen, tops = ref
    choice = answer["choices"][0]
    problems = []
    lp = choice["logprobs"]
    pieces = [tokenizer.decode([t]) for t in tokens]
    if lp["tokens"] != pieces:
        problems.append(f"tokens: worker {lp['tokens']!r}, mlx-lm {pieces!r}")
    for i, (want, got) in enumerate(zip(chosen, lp["token_logprobs"])):
        if abs(want - got) > tolerance:
            problems.append(f"step {i}: chosen log-probability {got:.5f} against mlx-lm's {want:.5f}")
    for i, (want, got) in enumerate(zip(tops, lp["top_logprobs"])):
        values = sorted(got.values(), reverse=True)
        if len(values) != len(want) or any(abs(a - b) > tolerance for a, b in zip(want, values)):
            problems.append(f"step {i}: top log-probabilities {values} against mlx-lm's {want}")
    if len(lp["token_logprobs"]) != len(chosen):
        problems.append(f"{len(lp['token_logprobs'])} tokens from the worker, {len(chosen)} from mlx-lm")
    return problems


def main(argv: list[str] | None = None) -> int:
    import mlx.core as mx
    import mlx_lm

    from mtpstack.worker.demo import DEMO_TARGET

    parser = argparse.ArgumentParser(prog="python -m devkit.demo.long_context", description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=66000, help="prompt tokens (default 66,000: past 64k)")
    parser.add_argument("--tokens", type=int, default=8, help="answer tokens compared")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest difference of a log-probability")
    args = parser.parse_args(argv)
    target, tokenizer = mlx_lm.load(str(DEMO_TARGET))
    context = json.loads((DEMO_TARGET / "config.json").read_text())["text_config"]["max_position_embeddings"]
    prompt = long_prompt(tokenizer, args.length)
    print(f"prompt: {len(prompt)} tokens; the target's context: {context}", flush=True)
    start = time.monotonic()
    ref = reference(target, prompt, args.tokens)
    print(f"mlx-lm ({time.monotonic() - start:.0f} s): {ref[0]} {tokenizer.decode(ref[0])!r}", flush=True)
    del target
    mx.clear_cache()
    with tempfile.TemporaryDirectory(prefix="long-context-") as tmp:
        start = time.monotonic()
        answer = served(prompt, args.tokens, Path(tmp))
    choice = answer["choices"][0]
    print(f"worker ({time.monotonic() - start:.0f} s): {choice['text']!r}; usage {answer['usage']}", flush=True)
    worst = max(abs(a - b) for a, b in zip(ref[1], choice["logprobs"]["token_logprobs"]))
    print(f"largest difference of a chosen log-probability: {worst:.2e}", flush=True)
    problems = compare(tokenizer, ref, answer, args.tolerance)
    for p in problems:
        print("differs: " + p, flush=True)
    print("same answer" if not problems else "NOT the same answer", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
