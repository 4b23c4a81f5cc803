"""What the engine's lossless tests compare against: the target's own greedy tokens, from mlx-lm's
plain `generate_step` (its own caches, no speculation), for a shared set of prompts."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import generate_step

PROMPTS = [
    "def main():",
    "The quick brown fox jumps over",
    "import os\nimport sys\n",
    "Copyright (C) 2024 Free Software Foundation, Inc.\n",
    "x",
]


def plain_greedy(engine, max_tokens: int, prompts: list[str] = PROMPTS) -> dict[str, list[int]]:
    """prompt -> the target's greedy tokens without speculation."""
    return {
        p: [t for t, _ in generate_step(mx.array(engine.text_prompt(p)), engine.target.model, max_tokens=max_tokens)]
        for p in prompts
    }
