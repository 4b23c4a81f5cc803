"""The grammar and constrained-decoding benches' tables are pure functions of their reports."""

from __future__ import annotations

from devkit.scripts import load_script

constrained_bench = load_script("constrained_bench")
grammar_bench = load_script("grammar_bench")


def span(median, lo, hi):
    return {"median": median, "min": lo, "max": hi, "n": 3}


def test_the_grammar_table_shows_median_and_range_per_library():
    report = {"vocab": 150000, "tokens": 36, "runs": 3, "libraries": {
        "llguidance": {"setup_s": span(1.2, 0.8, 1.5), "compile_s": span(0.001, 0.001, 0.002), "per_token_us": span(330, 240, 458)}}}
    lines = grammar_bench.format_lines(report)
    assert lines[0] == "vocabulary 150000 entries, document 36 tokens, 3 runs"
    assert lines[2].split()[0] == "llguidance" and "330 (240-458)" in lines[2] and "1.200 (0.800-1.500)" in lines[2]


def test_the_constrained_table_shows_median_mad_range_and_acceptance():
    report = {"tokens": 96, "rounds": 5, "depth": 3, "configs": {
        "drafter+schema": {"tok_s": {"median": 197.1, "mad": 36.1, "min": 160.9, "max": 295.4, "n": 5},
                           "tokens_per_run": 96.0, "drafted": 600, "accepted": 270}}}
    lines = constrained_bench.format_lines(report)
    assert "5 rounds (+1 warm-up discarded), depth 3" in lines[0]
    row = lines[2]
    assert row.startswith("drafter+schema") and "197.1 ± 36.1" in row and "160.9-295.4" in row and row.endswith("270/600")
