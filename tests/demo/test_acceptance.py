"""The acceptance tool measures what the worker's engine serves."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core", reason="the acceptance tool needs mlx")

from devkit.demo.acceptance import CODE_PROMPTS, PROSE_PROMPTS, format_head_rows, measure  # noqa: E402


def test_served_acceptance_counts_every_prompt_and_stays_within_what_was_drafted(hybrid_pair):
    target, head = hybrid_pair
    results = measure(target, head, depth=2, max_tokens=12)
    assert len(results) == len(CODE_PROMPTS) + len(PROSE_PROMPTS)
    assert all(0 <= r.from_draft <= r.drafted and 0 < r.generated <= 12 for r in results)
    assert sum(r.from_draft for r in results) > 0
    totals = format_head_rows(results)[-3:]
    assert [line.split("\t")[0] for line in totals] == ["code-total", "prose-total", "all-total"]
