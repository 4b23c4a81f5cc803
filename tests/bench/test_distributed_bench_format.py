"""The distributed bench's pure parts: summaries with spread, ratios against one process with the
same head setting, readable lines."""

from __future__ import annotations

from devkit.scripts import load_script

db = load_script("distributed_bench")


def test_summaries_keep_the_spread():
    assert db.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert db.spread([])["median"] is None
    assert db.fmt(db.spread([1.0, 2.0, 4.0])) == "2.0 (1.0-4.0, n=3)"
    assert db.fmt(db.spread([])) == "n/a"


def test_each_configuration_is_compared_with_one_process_of_the_same_head_setting():
    assert db.baseline_of("tensor+mtp") == "one+mtp" and db.baseline_of("pipeline") == "one"
    summary = {
        "one+mtp": {"1": db.spread([10.0]), "4": db.spread([20.0])},
        "one": {"1": db.spread([5.0])},
        "tensor+mtp": {"1": db.spread([5.0]), "4": db.spread([30.0])},
        "pipeline": {"1": db.spread([4.0]), "4": db.spread([4.0])},
    }
    rel = db.ratios(summary)
    assert rel["tensor+mtp"] == {"1": 0.5, "4": 1.5}
    assert rel["pipeline"] == {"1": 0.8, "4": None}  # no one-process figure at width 4


def test_report_lines_name_every_configuration_and_end_with_the_notes():
    summary = {"one": {"1": db.spread([5.0])}, "pipeline": {"1": db.spread([4.0])}}
    lines = db.report_lines(summary, db.ratios(summary), ["only 1 repeats"])
    text = "\n".join(lines)
    assert "one " in text and "0.80x" in text and "5.0 (5.0-5.0, n=1)" in text
    assert lines[-1] == "note: only 1 repeats"


def test_the_loss_report_gives_median_and_range_of_both_times():
    runs = [{"unhealthy_s": t, "exited_s": t + 1, "exit_code": 1} for t in (0.3, 0.1, 0.2)]
    assert db.loss_line("kill -9", runs) == (
        "kill -9: /health non-200 after 0.20 s (0.10-0.30); rank 0 exited after 1.20 s (1.10-1.30), exit codes [1], n=3"
    )
