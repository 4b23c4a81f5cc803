"""The benches' copies of the tiny family pairs: every MLP and expert wider, the target's greedy output unchanged."""

from __future__ import annotations

import json

import pytest

mx = pytest.importorskip("mlx.core", reason="the demo-model tests need mlx")

from devkit.demo.tiny_families import PAIRS, build_bench_pair  # noqa: E402


@pytest.mark.parametrize("family", sorted(PAIRS))
def test_a_widened_pair_decodes_what_the_tiny_one_does(tmp_path, family):
    from mtpstack.worker.loading import Engine
    from tests.worker.greedy import plain_greedy

    wide, head = build_bench_pair(family, tmp_path, 4)
    tiny = next(p for p in (tmp_path / "tiny" / "target",) if p.is_dir())
    before, after = json.loads((tiny / "config.json").read_text()), json.loads((wide / "config.json").read_text())
    text = lambda c: c.get("text_config", c)  # noqa: E731
    key = "moe_intermediate_size" if "moe_intermediate_size" in text(before) else "intermediate_size"  # dense: qwen3_5
    assert text(after)[key] == 4 * text(before)[key]
    assert plain_greedy(Engine.load(str(wide), str(head)), 12) == plain_greedy(Engine.load(str(tiny), str(head)), 12)
