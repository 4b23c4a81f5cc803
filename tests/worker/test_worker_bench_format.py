"""The worker bench's pure summaries: medians with spread, ratios of medians, readable lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("worker_bench", Path(__file__).resolve().parents[2] / "bench" / "worker_bench.py")
wb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wb)


def test_summaries_keep_the_spread():
    assert wb.summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert wb.summarize([])["median"] is None
    assert wb.fmt(wb.summarize([1.0, 2.0, 4.0])) == "2.00 (1.00-4.00, n=3)"


def test_a_ratio_needs_both_medians():
    assert wb.ratio({"median": 3.0}, {"median": 2.0}) == 1.5
    assert wb.ratio({"median": None}, {"median": 2.0}) is None


def test_report_lines_name_every_configuration():
    s = wb.summarize([10.0])
    summary = {
        "single": {"native+drafter": {"tok_s": s, "ttft_s": s}},
        "speedup": {"native": 1.2, "stream_generate": None},
        "speedup_share": 0.97,
        "concurrent": {"native+drafter": {"aggregate_tok_s": s, "ttft_median_s": s, "ttft_max_s": s}},
        "notes": ["only 1 repeats"],
    }
    text = "\n".join(wb.report_lines(summary))
    assert "native+drafter" in text and "1.200x" in text and "n/a" in text and "0.970" in text
    assert text.splitlines()[-1] == "note: only 1 repeats"
