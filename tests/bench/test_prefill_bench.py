"""The long-prompt bench: its counting and summaries, and one real run on the demo pair."""

from __future__ import annotations

import pytest

from devkit.scripts import load_script
from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET
from tests.bench.conftest import run_bench

prefill_bench = load_script("prefill_bench")


class Words:
    """A tokenizer of whitespace-separated words: what `Counted` needs of one."""

    def encode(self, text):
        return text.split()


def test_a_stream_is_counted_in_tokens_not_events_and_its_gaps_include_the_windows_edges():
    c = prefill_bench.Counted(Words())
    c.add("a b ", 1.0)
    c.add("c d e f ", 2.0)  # one event, four tokens (a speculative step)
    c.add("g ", 5.0)
    assert c.rate(1.5, 2.5) == pytest.approx(4 / 1.0)
    assert c.rate(2.5, 4.5) == 0.0  # tokens came after the window: nothing inside it
    assert c.longest_gap(1.5, 6.0) == pytest.approx(3.0)
    assert c.longest_gap(2.5, 3.0) == pytest.approx(0.5)
    # where a stream's count stood at a time, and when it reached a count: a run alone is timed over the same tokens
    assert (c.count_at(0.5), c.count_at(2.0), c.count_at(4.9)) == (0, 6, 6)
    assert (c.time_at(2), c.time_at(3), c.time_at(7), c.time_at(8)) == (1.0, 2.0, 5.0, None)


def test_the_summary_leaves_out_streams_that_ended_early_and_counts_them():
    def run(kept, ended):
        streams = [{"kept": kept, "longest_gap_s": 0.2, "ended_early": ended}]
        return {"cold": {"512": {"tok_s": 100.0}, "peak_mib": 200.0},
                "beside": {str(d): {"streams": streams, "ttft_ratio": 1.4} for d in prefill_bench.DECODERS},
                "warm": {"ttft_s": 0.3, "cached_tokens": 500}}

    s = prefill_bench.summary({"x": [run(0.6, False), run(0.1, True)]}, [512])["x"]
    assert s["kept@2"]["median"] == 0.6 and s["kept@2"]["n"] == 1 and s["ended_early@2"] == 1
    assert s["prefill_tok_s@512"]["n"] == 2
    lines = prefill_bench.report_lines({"x": s})
    assert lines[0] == "| | x |" and any(line.startswith("| kept@2 | 0.600") for line in lines)


def test_a_report_taken_before_the_end_says_so_and_summarizes_only_the_servers_measured():
    import argparse

    args = argparse.Namespace(lengths=[512], rounds=2, depth=3)
    sample = {"cold": {"512": {"tok_s": 100.0}, "peak_mib": 200.0}}
    partial = prefill_bench.report(args, "demo", {"a": [sample], "b": []}, done=False)
    assert partial["meta"]["partial"] is True and list(partial["summary"]) == ["a"]
    assert partial["summary"]["a"]["prefill_tok_s@512"]["median"] == 100.0
    assert "partial" not in prefill_bench.report(args, "demo", {"a": [sample]}, done=True)["meta"]


def test_one_round_on_the_demo_pair_reports_every_figure(tmp_path):
    report, done = run_bench("prefill_bench", tmp_path / "prefill.json", "--target", str(DEMO_TARGET), "--drafter",
                             str(DEMO_HEAD), "--lengths", "256", "--warm-tokens", "100", "--rounds", "1", "--configs",
                             "native+mtp")
    assert "partial" not in report["meta"]  # the end's report replaced the one written after the round
    (sample,) = report["samples"]["native+mtp"]
    assert sample["cold"]["256"]["prompt_tokens"] >= 256 and sample["cold"]["256"]["tok_s"] > 0
    for decoders in prefill_bench.DECODERS:
        streams = sample["beside"][str(decoders)]["streams"]
        assert len(streams) == decoders
        assert not any(s["ended_early"] for s in streams)  # the native worker decodes past its end of turn
        assert all(s["alone_tok_s"] > 0 and s["before_tok_s"] > 0 and s["longest_gap_s"] > 0 for s in streams)
        assert all(s["tokens"][1] > s["tokens"][0] for s in streams)  # the streams decoded beside the prompt
    assert sample["warm"]["cached_tokens"] > 100  # the second turn resumed from the first's prefix
    assert "| prefill_tok_s@256 |" in done.stderr
