"""Measure how often a drafter's tokens are accepted, with mlx-lm's own speculative decoding.

    python -m worker.demo.acceptance [TARGET DRAFTER] [--depth 3] [--max-tokens 128]

Acceptance here is the share of generated tokens that came from the drafter (`from_draft` in
`mlx_lm.generate.stream_generate`) under greedy decoding. Prints one line per prompt and the
total to stdout, as tab-separated values.
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


def measure(target_dir: Path, drafter_dir: Path, *, depth: int = 3, max_tokens: int = 128) -> list[Acceptance]:
    import mlx_lm
    from mlx_lm.generate import stream_generate

    target, tokenizer = mlx_lm.load(str(target_dir))
    drafter, _ = mlx_lm.load(str(drafter_dir))
    results = []
    for kind, prompts in (("code", CODE_PROMPTS), ("prose", PROSE_PROMPTS)):
        for prompt in prompts:
            flags = [
                r.from_draft
                for r in stream_generate(target, tokenizer, prompt, max_tokens=max_tokens, draft_model=drafter,
                                         num_draft_tokens=depth)
            ]
            results.append(Acceptance(prompt, kind, len(flags), sum(flags)))
    return results


def format_rows(results: list[Acceptance]) -> list[str]:
    lines = ["kind\tgenerated\tfrom_draft\trate\tprompt"]
    for r in results:
        lines.append(f"{r.kind}\t{r.generated}\t{r.from_draft}\t{r.rate:.2f}\t{r.prompt[:40]!r}")
    for kind in ("code", "prose", "all"):
        rows = [r for r in results if kind in (r.kind, "all")]
        gen = sum(r.generated for r in rows)
        acc = sum(r.from_draft for r in rows)
        lines.append(f"{kind}-total\t{gen}\t{acc}\t{acc / gen if gen else 0:.2f}\t")
    return lines


def main(argv: list[str] | None = None) -> int:
    from worker.demo import DEMO_DRAFTER, DEMO_TARGET

    parser = argparse.ArgumentParser(prog="python -m worker.demo.acceptance", description=__doc__.split("\n")[0])
    parser.add_argument("target", type=Path, nargs="?", default=DEMO_TARGET)
    parser.add_argument("drafter", type=Path, nargs="?", default=DEMO_DRAFTER)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    for line in format_rows(measure(args.target, args.drafter, depth=args.depth, max_tokens=args.max_tokens)):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
