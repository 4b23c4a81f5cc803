"""The worker bench's pure summaries: medians with spread, ratios of medians, readable lines."""

from __future__ import annotations

from devkit.scripts import load_script

wb = load_script("worker_bench")


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
        "single": {"native+mtp": {"tok_s": s, "ttft_s": s}},
        "speedup": {"native": 1.2, "mlx-vlm": None},
        "predicted": wb.predicted_speedup(0.5, 2, {"plain_s": 1.0, "verify_s": 1.5, "head_s": 0.25}),
        "concurrent": {"native+mtp": {"aggregate_tok_s": s, "ttft_median_s": s, "ttft_max_s": s}},
        "goals": {"aggregate at 4: native+mtp / mlx_lm.server (goal >= 1)": 1.25},
        "notes": ["only 1 repeats"],
    }
    text = "\n".join(wb.report_lines(summary))
    assert "native+mtp" in text and "1.200x" in text and "n/a" in text and "1.25" in text
    assert "predicted from acceptance 0.50 at depth 2" in text
    assert text.splitlines()[-1] == "note: only 1 repeats"


def test_the_prediction_counts_tokens_per_step_against_the_step_cost():
    # acceptance 0.5 at depth 2: 1 + 0.5 + 0.25 tokens per step; a step costs (1.5 + 2 * 0.25) plain forwards
    p = wb.predicted_speedup(0.5, 2, {"plain_s": 1.0, "verify_s": 1.5, "head_s": 0.25})
    assert p["tokens_per_step"] == 1.75 and p["step_cost"] == 2.0 and p["speedup"] == 0.875


def test_single_stream_ttft_is_reported_apart_for_prefix_cache_hits_and_whole_prefills():
    runs = [{"tok_s": 10.0, "ttft_s": 0.5, "cached_tokens": 0}, {"tok_s": 12.0, "ttft_s": 0.7, "cached_tokens": 0},
            {"tok_s": 11.0, "ttft_s": 0.05, "cached_tokens": 9}]
    s = wb.single_summary(runs)
    assert s["ttft_s"]["n"] == 3 and s["ttft_cold_s"]["median"] == 0.6 and s["ttft_hit_s"]["median"] == 0.05
    lines = wb.report_lines({"single": {"native+mtp": s}, "speedup": {}, "concurrent": {}})
    assert any("from the prefix cache 0.050 s" in line and "prefilled whole 0.600 s" in line for line in lines)
