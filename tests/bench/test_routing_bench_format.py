"""The routing bench's pure parts: the conversation it sends, what counts as an affinity hit, the
summaries per policy, and the table (medians with spread, never a lone ratio)."""

from __future__ import annotations

import json

from devkit.scripts import load_script

rb = load_script("routing_bench")


def row(run, conv, turn, worker, ttft, routing="affinity", policy="affinity", cached=0):
    return {"run": run, "conversation": conv, "turn": turn, "worker": worker, "ttft_s": ttft, "routing": routing,
            "policy": policy, "prompt_tokens": 100 * turn, "cached_tokens": cached}


def test_each_turn_resends_the_conversation_with_every_answer_as_the_assistant_turn():
    system = rb.system_prompt(0, 40)
    first = rb.messages_for(system, 2, [])
    third = rb.messages_for(system, 2, ["a1", "a2"])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[: len(first)] == first  # the next turn begins with the previous one: a prefix to reuse
    assert [m["content"] for m in third if m["role"] == "assistant"] == ["a1", "a2"]
    other = rb.messages_for(system, 1, [])
    assert other[0] == first[0] and other[1] != first[1]  # one agent's system prompt, then each its own task


def test_tool_output_lengthens_each_follow_up_with_lines_of_its_own_conversation_and_turn():
    system = rb.system_prompt(0, 4)
    plain = rb.messages_for(system, 1, ["a1", "a2"])
    long = rb.messages_for(system, 1, ["a1", "a2"], output_lines=5)
    assert long[:3] == plain[:3]  # the beginning is the same conversation
    assert long[3]["content"].endswith("\n\n" + plain[3]["content"]) and long[3]["content"].count("\n") == 4 + 2
    assert long[3]["content"] != long[5]["content"].replace(plain[5]["content"], plain[3]["content"])
    assert rb.tool_output(1, 2, 3) != rb.tool_output(2, 2, 3)


def test_a_hit_is_a_later_turn_on_the_worker_of_the_previous_turn_of_the_same_run():
    rows = [row(0, 0, 1, "w1", 1.0), row(0, 0, 2, "w1", 0.2), row(0, 0, 3, "w0", 0.9),
            row(0, 1, 1, "w0", 1.0), row(0, 1, 2, None, 0.3),  # unknown worker: not counted
            row(1, 0, 1, "w0", 1.0), row(1, 0, 2, "w0", 0.2)]
    assert rb.stayed(rows) == [True, False, True]


def test_a_policy_summary_keeps_turn_1_apart_and_counts_decisions_and_cache_hits():
    rows = [row(0, 0, 1, "w1", 2.0, "new"), row(0, 0, 2, "w1", 0.5, cached=100), row(0, 0, 3, "w1", 0.7, cached=200),
            row(2, 0, 1, "w0", 3.0, "new"), row(2, 0, 2, "w1", 0.9, "fallback_busy")]
    runs = [{"run": 0, "prefix_cache": {"hits": 3, "lookups": 4}}, {"run": 2, "prefix_cache": None}]
    s = rb.summarize_policy(rows, runs)
    assert (s["ttft_turn1_s"]["median"], s["ttft_turn1_s"]["n"]) == (2.5, 2)
    assert (s["ttft_later_s"]["median"], s["ttft_later_s"]["min"], s["ttft_later_s"]["max"]) == (0.7, 0.5, 0.9)
    assert s["ttft_later_per_run_s"] == [0.6, 0.9]
    assert (s["affinity_hit_rate"], s["affinity_hits"]) == (2 / 3, [2, 3])
    assert s["decisions"] == {"new": 2, "affinity": 2, "fallback_busy": 1}
    assert (s["prefix_cache_hit_rate"], s["prefix_cache"]) == (0.75, [3, 4])
    assert (s["cached_share_later"], s["cached_tokens_later"]) == (300 / 700, [300, 700])


def test_tool_pauses_are_the_same_for_both_policies_of_a_round_and_none_before_turn_1():
    assert rb.tool_pause(1.0, 0, 2, 3) == rb.tool_pause(1.0, 0, 2, 3)
    assert rb.tool_pause(1.0, 0, 2, 3) != rb.tool_pause(1.0, 1, 2, 3)
    assert rb.tool_pause(1.0, 0, 2, 1) == 0.0 and rb.tool_pause(0.0, 0, 2, 3) == 0.0
    assert all(0 <= rb.tool_pause(0.5, r, c, 2) <= 1.0 for r in range(5) for c in range(4))


def test_the_policies_alternate_with_their_order_rotating():
    assert [rb.policy_order(i) for i in range(3)] == [("affinity", "first-free"), ("first-free", "affinity"), ("affinity", "first-free")]


def test_the_proxys_request_lines_are_read_by_request_id_and_other_lines_skipped():
    log = "\n".join([json.dumps({"event": "listening"}), "not json",
                     json.dumps({"event": "request", "request_id": "r1", "worker": "w1", "routing": "affinity"})])
    assert rb.request_lines(log) == {"r1": {"event": "request", "request_id": "r1", "worker": "w1", "routing": "affinity"}}


def report(comparison, prefix_cache=None):
    s = {"ttft_turn1_s": {"median": 1.5, "min": 1.2, "max": 2.0, "n": 4}, "ttft_later_s": {"median": 0.25, "min": 0.2, "max": 0.41, "n": 8},
         "prompt_tokens": {"median": 900, "min": 700, "max": 1100, "n": 12}, "affinity_hit_rate": 0.875, "affinity_hits": [7, 8],
         "decisions": {"affinity": 7, "new": 4, "fallback_busy": 1}, "prefix_cache_hit_rate": 0.5 if prefix_cache else None,
         "prefix_cache": prefix_cache, "ttft_later_per_run_s": [0.25], "cached_share_later": 0.5, "cached_tokens_later": [450, 900]}
    meta = {"conversations": 4, "turns": 3, "workers": 2, "width": 2, "answer_tokens": 8, "rounds": 1, "pause": 0.3}
    return {"meta": meta, "summary": {"policies": {"affinity": s, "first-free": s}, "comparison": comparison, "notes": ["n"]}}


def test_the_table_shows_medians_with_spread_hit_rates_and_says_when_no_cache_is_there():
    lines = rb.format_lines(report(None))
    assert lines[0] == ("4 conversations x 3 turns through the proxy, 2 workers of width 2, 8 answer tokens, "
                        "tool pauses 0.3 s on average, 1 round(s) per policy, alternated")
    assert "  TTFT turns 2+   0.25 s (0.20-0.41, n=8)" in lines
    assert "  affinity hits   88% (7 of 8) of turns 2+ on the previous turn's worker" in lines
    assert "  routing         affinity 7, fallback_busy 1, new 4" in lines
    assert "  cached tokens   50% (450 of 900) of turns 2+'s prompt tokens" in lines
    assert "  prefix cache    - (the workers export no prefix-cache series)" in lines
    assert "  prefix cache    50% (2 of 4)" in rb.format_lines(report(None, prefix_cache=[2, 4]))
    assert lines[-2:] == ["comparison: n/a", "note: n"]


def test_the_comparison_says_too_few_passes_or_not_significant_before_any_ratio():
    few = rb.format_lines(report({"decision": "too few passes", "ratio": None, "lo": None, "hi": None, "n": [1, 1]}))
    assert "comparison: too few passes (1 and 1 runs; 3 each needed): rerun with --rounds 3 or more" in few
    ns = rb.format_lines(report({"decision": "not significant", "ratio": 1.04, "lo": 0.9, "hi": 1.2, "n": [3, 3]}))
    assert any(line.startswith("comparison: not significant: TTFT turns 2+, first-free / affinity 1.04x (0.90-1.20") for line in ns)
    win = rb.format_lines(report({"decision": "adopt", "ratio": 6.0, "lo": 4.0, "hi": 9.0, "n": [3, 3]}))
    assert any(line.startswith("comparison: affinity answers sooner: TTFT turns 2+, first-free / affinity 6.00x") for line in win)


def test_compare_refuses_a_verdict_on_fewer_than_three_runs_a_side():
    policies = {"affinity": {"ttft_later_per_run_s": [0.2]}, "first-free": {"ttft_later_per_run_s": [1.0]}}
    assert rb.compare(policies)["decision"] == "too few passes"
    policies = {"affinity": {"ttft_later_per_run_s": [0.2, 0.21, 0.19]}, "first-free": {"ttft_later_per_run_s": [1.0, 1.1, 0.9]}}
    c = rb.compare(policies)
    assert c["decision"] == "adopt" and c["ratio"] == 5.0
