"""Measure how often a drafter's tokens are accepted under greedy decoding.

    python -m devkit.demo.acceptance [TARGET DRAFTER] [--depth 3] [--max-tokens 128] [--function-level]

Served acceptance (the default): each prompt decoded greedily by the worker's own engine
(`mtpstack.worker.loading`, the drafter's kind detected as the worker does), counting drafted and accepted
tokens. `--function-level` (MTP heads only): the target's greedy continuation is fixed; at each
decode step the head chain drafts `depth` tokens from the target's hidden state (`head_chain_steps`),
the accepted prefix is counted and the target adds one token of its own. Prints one line per prompt
and the totals to stdout, as tab-separated values.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

# Prompts in the style of the training text: Python code and Debian package prose.
CODE_PROMPTS = (
    "import os\nimport sys\n\n\ndef main():\n",
    "class Parser:\n    def __init__(self, text):\n",
    "    for name, value in sorted(items.items()):\n",
    "def read_config(path):\n    \"\"\"Return the parsed configuration file.\"\"\"\n",
)
PROSE_PROMPTS = (
    "This program is free software; you can redistribute it",
    "The following files are distributed under the terms of",
    "  * New upstream release.\n",
    "Permission is hereby granted, free of charge, to any person",
)


@dataclass(frozen=True)
class Acceptance:
    prompt: str
    kind: str
    generated: int
    from_draft: int

    @property
    def rate(self) -> float:
        return self.from_draft / self.generated if self.generated else 0.0


@dataclass(frozen=True)
class HeadAcceptance(Acceptance):
    drafted: int = 0

    @property
    def accepted_per_drafted(self) -> float:
        return self.from_draft / self.drafted if self.drafted else 0.0


def head_chain_steps(target, head, prompt_ids: list[int], continuation: list[int], depth: int) -> tuple[int, int]:
    """(drafted, accepted) over the greedy `continuation` when each step drafts `depth` tokens with `head`.

    A step starts when the target has just produced the token at position q: the head has seen
    (embedding of token t+1, target hidden h[t]) for every t < q, drafts token q+1 from its output
    at q-1, then feeds its own output and draft back for q+2, ... The accepted prefix plus the
    target's own next token advance q.
    """
    import mlx.core as mx

    lm = target.language_model
    text = lm.model
    logits = text.embed_tokens.as_linear if lm.args.tie_word_embeddings else lm.lm_head
    seq = prompt_ids + continuation
    tokens = mx.array([seq])
    hidden = text(tokens)
    embeddings = text.embed_tokens(tokens)
    drafted = accepted = 0
    q = len(prompt_ids)
    while q < len(seq) - 1:
        cache = head.make_cache()
        out = head(embeddings[:, 1 : q + 1], hidden[:, :q], cache)[:, -1:]
        ahead = min(depth, len(seq) - 1 - q)
        run = 0
        for i in range(1, ahead + 1):
            draft = mx.argmax(logits(out), axis=-1)
            if draft.item() != seq[q + i]:
                break
            run += 1
            if i < ahead:
                out = head(text.embed_tokens(draft), out, cache)
        drafted += ahead
        accepted += run
        q += run + 1
    return drafted, accepted


def measure_head(target_dir: Path, head_dir: Path, *, depth: int = 3, max_tokens: int = 128) -> list[HeadAcceptance]:
    """Function-level acceptance of an MTP head folder against its target (see `head_chain_steps`)."""
    import mlx_lm
    from mlx_lm.generate import stream_generate

    from mtpstack.worker.mtp import load_head

    target, tokenizer = mlx_lm.load(str(target_dir))
    head = load_head(Path(head_dir), Path(target_dir)).module
    results = []
    for kind, prompts in (("code", CODE_PROMPTS), ("prose", PROSE_PROMPTS)):
        for prompt in prompts:
            ids = tokenizer.encode(prompt)
            continuation = [r.token for r in stream_generate(target, tokenizer, ids, max_tokens=max_tokens)]
            drafted, accepted = head_chain_steps(target, head, ids, continuation, depth)
            results.append(HeadAcceptance(prompt, kind, len(continuation), accepted, drafted))
    return results


def measure(target_dir: Path, drafter_dir: Path, *, depth: int = 3, max_tokens: int = 128) -> list["HeadAcceptance"]:
    """Served acceptance: greedy decoding by the worker's engine, drafted and accepted tokens counted."""
    from mtpstack.worker.loading import Engine
    from mtpstack.worker.sequence import SamplingParams

    from devkit.engine import run

    engine = Engine.load(str(target_dir), str(drafter_dir), draft_depth=depth)
    results = []
    for kind, prompts in (("code", CODE_PROMPTS), ("prose", PROSE_PROMPTS)):
        for prompt in prompts:
            seq = engine.new_sequence(engine.text_prompt(prompt), SamplingParams(max_tokens=max_tokens, depth=depth))
            run(seq)
            results.append(HeadAcceptance(prompt, kind, len(seq.tokens), seq.accepted, seq.drafted))
    return results


def format_head_rows(results: list[HeadAcceptance]) -> list[str]:
    lines = ["kind\tgenerated\tdrafted\taccepted\taccepted/drafted\tfrom_head\tprompt"]
    for r in results:
        lines.append(f"{r.kind}\t{r.generated}\t{r.drafted}\t{r.from_draft}\t{r.accepted_per_drafted:.2f}\t"
                     f"{r.rate:.2f}\t{r.prompt[:40]!r}")
    for kind in ("code", "prose", "all"):
        rows = [r for r in results if kind in (r.kind, "all")]
        gen, dra, acc = (sum(getattr(r, f) for r in rows) for f in ("generated", "drafted", "from_draft"))
        lines.append(f"{kind}-total\t{gen}\t{dra}\t{acc}\t{acc / dra if dra else 0:.2f}\t"
                     f"{acc / gen if gen else 0:.2f}\t")
    return lines


def main(argv: list[str] | None = None) -> int:
    from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

    parser = argparse.ArgumentParser(prog="python -m devkit.demo.acceptance", description=__doc__.split("\n")[0])
    parser.add_argument("target", type=Path, nargs="?", default=DEMO_TARGET)
    parser.add_argument("drafter", type=Path, nargs="?", default=DEMO_HEAD)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--function-level", action="store_true", help="MTP heads: the head chain on fixed greedy text")
    args = parser.parse_args(argv)
    if args.function_level:
        print(f"# function-level: MTP head chain at depth {args.depth} on the target's greedy text")
        results = measure_head(args.target, args.drafter, depth=args.depth, max_tokens=args.max_tokens)
    else:
        print(f"# served: the worker's engine, greedy, depth {args.depth}")
        results = measure(args.target, args.drafter, depth=args.depth, max_tokens=args.max_tokens)
    lines = format_head_rows(results)
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
