"""The agent benchmark's summaries and table are pure functions of its raw samples."""

from __future__ import annotations

import pytest

from devkit.scripts import load_script

agent_bench = load_script("agent_bench")


def samples(turns, shared, conc, itl=()):
    return {"turns": turns, "shared": shared, "concurrent": conc, "prefill_itl": list(itl)}


def test_turns_after_the_first_are_summarized_apart_and_against_their_own_first_turn():
    s = agent_bench.summarize_samples({"native+mtp": samples([[10.0, 1.0, 2.0], [20.0, 2.0, 2.0]], [(1.0, 10.0)], [3.0])})
    v = s["native+mtp"]
    assert v["turn1_ttft_s"]["median"] == 15.0 and v["later_ttft_s"]["median"] == 2.0 and v["later_ttft_s"]["n"] == 4
    assert v["later_over_turn1"]["min"] == pytest.approx(0.1) and v["later_over_turn1"]["max"] == pytest.approx(0.15)
    assert [t["median"] for t in v["per_turn_ttft_s"]] == [15.0, 1.5, 2.0]
    assert v["shared_over_first"]["median"] == pytest.approx(0.1)


def test_the_itl_window_keeps_only_gaps_that_end_while_the_long_prompt_is_prefilled():
    times = [0.0, 0.1, 0.2, 1.2, 2.2, 2.3, 2.4]
    w = agent_bench.itl_window(times, start=0.15, end=2.25)
    assert w["n"] == 3 and w["median_s"] == pytest.approx(1.0) and w["p99_s"] == pytest.approx(1.0)
    assert w["outside_median_s"] == pytest.approx(0.1)
    assert agent_bench.itl_window(times, 5.0, 6.0)["n"] == 0


def test_the_table_names_both_servers_and_their_ratio():
    summary = agent_bench.summarize_samples({
        "native+mtp": samples([[1.0, 0.1]], [(0.1, 1.0)], [0.5], [{"median_s": 0.2, "p99_s": 0.3, "outside_median_s": 0.01}]),
        "mlx_lm.server": samples([[1.0, 0.2]], [(0.2, 1.0)], [0.5]),
    })
    lines = agent_bench.format_lines({"summary": summary, "rounds": 1, "warmup": 0, "prompt_tokens": "900-1200"})
    text = "\n".join(lines)
    assert "turns 2+ TTFT: native+mtp / mlx_lm.server = 0.50x" in text
    assert "p99/median 1.50x" in text and "900-1200 tokens" in lines[0]
