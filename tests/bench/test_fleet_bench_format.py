"""The fleet bench's pure parts: the figures per round and per stack, the comparison against mtpstack,
the table and the plot (the agent workload it replays: test_workloads.py); and one small real run of each mode."""

from __future__ import annotations

import json

import pytest

from devkit.scripts import load_script
from tests.bench.conftest import run_bench

fb = load_script("fleet_bench")

SIZES = {**fb.FULL, "sessions": 4, "turns": (3, 5), "output_tokens": (200, 2000)}


def row(stack, rnd, session, turn, ttft, total, *, status="ok", sent=0.0, out=10, prompt=100, cached=None):
    return {"stack": stack, "round": rnd, "session": session, "turn": turn, "status": status, "ttft_s": ttft, "total_s": total,
            "sent_s": sent, "completion_tokens": out, "prompt_tokens": prompt, "cached_tokens": cached}


def test_a_round_counts_failures_apart_and_measures_latency_and_throughput_on_answered_turns():
    rows = [row("m", 0, 0, 1, 1.0, 2.0, sent=0.0, out=20, cached=50), row("m", 0, 0, 2, 3.0, 4.0, sent=2.0, out=20, cached=100),
            row("m", 0, 1, 1, None, 9.0, status="429", sent=1.0), row("m", 0, 1, 2, None, 1.0, status="timeout", sent=9.0),
            row("m", 0, 2, 1, None, 0.1, status="error", sent=1.0)]
    m = fb.round_metrics(rows)
    assert (m["ttft_p50"], m["ttft_p95"], m["turn_p50"], m["turn_p95"]) == (1.0, 3.0, 2.0, 4.0)
    assert m["tok_s"] == 40 / 10.0  # answered turns' tokens over the first send to the last end (9 + 1)
    assert m["cached_share"] == 150 / 200
    assert (m["error"], m["429"], m["timeout"], m["turns"]) == (1, 1, 1, 5)


def test_a_stack_that_reports_no_cached_tokens_has_no_cache_figure():
    assert fb.round_metrics([row("n", 0, 0, 1, 1.0, 2.0)])["cached_share"] is None


def test_per_stack_figures_are_medians_over_rounds_with_min_max():
    rows = [row("m", r, 0, 1, t, t + 1, sent=0) for r, t in enumerate([1.0, 2.0, 4.0])]
    s = fb.summarize_stacks(rows)["m"]
    assert s["ttft_p50"] == {"median": 2.0, "min": 1.0, "max": 4.0, "n": 3}
    assert s["error"] == {"median": 0, "min": 0, "max": 0, "n": 3} and s["rounds"] == 3


def workload_rows(stack, scale, rounds=3, sessions=4):
    return [row(stack, r, s, t, scale * (1 + 0.1 * t + 0.05 * s), scale * (2 + 0.1 * t), sent=10.0 * t + s, out=10)
            for r in range(rounds) for s in range(sessions) for t in range(1, 4)]


def test_other_stacks_are_compared_with_mtpstack_with_an_interval_around_the_ratio():
    rows = workload_rows("mtpstack", 1.0) + workload_rows("nginx", 2.0)
    c = fb.compare(rows, resamples=300)["nginx"]
    for key in ("ttft_p50", "ttft_p95", "turn_p50", "turn_p95"):
        assert abs(c[key]["ratio"] - 2.0) < 1e-9 and c[key]["lo"] <= 2.0 <= c[key]["hi"] and c[key]["n"] == [12, 12]
    assert c["tok_s"]["n"] == [3, 3] and c["tok_s"]["lo"] is not None
    assert "mtpstack" not in fb.compare(rows, resamples=50)


def test_throughput_with_too_few_rounds_gets_a_ratio_and_no_interval():
    rows = workload_rows("mtpstack", 1.0, rounds=2) + workload_rows("litellm", 1.5, rounds=2)
    c = fb.compare(rows, resamples=50)["litellm"]["tok_s"]
    assert c["lo"] is None and c["hi"] is None and c["ratio"] > 0


def test_ttft_by_turn_pools_sessions_and_rounds_per_turn_number():
    rows = [row("m", 0, 0, 1, 4.0, 5), row("m", 1, 1, 1, 6.0, 7), row("m", 0, 0, 2, 1.0, 2), row("m", 0, 0, 3, None, 1, status="error")]
    by = fb.ttft_by_turn(rows)["m"]
    assert by == [{"turn": 1, "median": 5.0, "p95": 6.0, "n": 2}, {"turn": 2, "median": 1.0, "p95": 1.0, "n": 1}]


def report_of(rows):
    meta = {"sizes": SIZES, "rounds_run": 3, "models": "tiny", "loadavg_start": [2.5, 2, 2], "loadavg_end": [3.0, 2, 2]}
    return {"meta": meta, "summary": fb.summary_of(rows, 3)}


def test_the_table_has_a_row_per_stack_the_ratios_with_intervals_and_the_goal():
    rows = workload_rows("mtpstack", 1.0) + workload_rows("litellm", 2.0) + workload_rows("nginx", 3.0)
    rows.append(row("nginx", 0, 9, 1, None, 1.0, status="429"))
    lines = fb.format_lines(report_of(rows))
    text = "\n".join(lines)
    assert any(line.startswith("mtpstack ") for line in lines) and any(line.startswith("nginx ") for line in lines)
    assert "litellm / mtpstack: turn TTFT p50 2.00x [" in text
    assert "load average 2.5 at the start, 3.0 at the end" in text
    assert "goal: turn TTFT p95: met: best is mtpstack" in text
    assert "goal: zero errors, 429s and timeouts for mtpstack: met" in text
    nginx = next(line for line in lines if line.startswith("nginx "))
    assert "0 (0-1)" in nginx  # the 429 of one round: median 0, min 0, max 1


def test_the_goal_names_the_stack_that_beat_mtpstack():
    rows = workload_rows("mtpstack", 2.0) + workload_rows("litellm", 1.0)
    goal = fb.goal_lines(fb.summary_of(rows, 3))
    assert goal[0].startswith("turn TTFT p95: not met: best is litellm")


def test_stacks_rotate_so_that_none_always_runs_first():
    firsts = {fb.rotated(list(fb.STACKS), r)[0] for r in range(3)}
    assert firsts == set(fb.STACKS)
    assert sorted(fb.rotated(list(fb.STACKS), 1)) == sorted(fb.STACKS)


def test_the_ttft_by_turn_plot_is_written(tmp_path):
    rows = workload_rows("mtpstack", 1.0) + workload_rows("nginx", 2.0)
    path = fb.plot_ttft_by_turn(fb.ttft_by_turn(rows), tmp_path / "ttft.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_litellm_routes_one_model_name_over_both_servers_least_busy_with_a_master_key():
    config = fb.litellm_config([8001, 8002], "/models/t")
    assert [d["litellm_params"]["api_base"] for d in config["model_list"]] == ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"]
    assert {d["model_name"] for d in config["model_list"]} == {"bench"}
    assert config["model_list"][0]["litellm_params"]["model"] == "openai//models/t"  # mlx_lm.server wants the path it loaded
    assert config["router_settings"]["routing_strategy"] == "least-busy"
    assert config["general_settings"]["master_key"] == fb.API_KEY


# -- `--routing`: affinity against first-free on the agent conversations ------------------------------


def rrow(rnd, session, turn, worker, ttft, routing="affinity", stack="mtpstack", cached=0):
    return {"round": rnd, "session": session, "turn": turn, "worker": worker, "ttft_s": ttft, "routing": routing,
            "stack": stack, "prompt_tokens": 100 * turn, "cached_tokens": cached, "status": "ok"}


def test_a_hit_is_a_later_turn_on_the_worker_of_the_previous_turn_of_the_same_run():
    rows = [rrow(0, 0, 1, "w1", 1.0), rrow(0, 0, 2, "w1", 0.2), rrow(0, 0, 3, "w0", 0.9),
            rrow(0, 1, 1, "w0", 1.0), rrow(0, 1, 2, None, 0.3),  # unknown worker: not counted
            rrow(1, 0, 1, "w0", 1.0), rrow(1, 0, 2, "w0", 0.2)]
    assert fb.stayed(rows) == [True, False, True]


def test_a_policy_summary_keeps_turn_1_apart_and_counts_decisions_and_cache_hits():
    rows = [rrow(0, 0, 1, "w1", 2.0, "new"), rrow(0, 0, 2, "w1", 0.5, cached=100), rrow(0, 0, 3, "w1", 0.7, cached=200),
            rrow(2, 0, 1, "w0", 3.0, "new"), rrow(2, 0, 2, "w1", 0.9, "fallback_busy")]
    runs = [{"round": 0, "workers": {"prefix_cache_hits": 3, "prefix_cache_lookups": 4}}, {"round": 2, "workers": None}]
    s = fb.summarize_policy(rows, runs)
    assert (s["ttft_turn1_s"]["median"], s["ttft_turn1_s"]["n"]) == (2.5, 2)
    assert (s["ttft_later_s"]["median"], s["ttft_later_s"]["min"], s["ttft_later_s"]["max"]) == (0.7, 0.5, 0.9)
    assert s["ttft_later_per_run_s"] == [0.6, 0.9]
    assert (s["affinity_hit_rate"], s["affinity_hits"]) == (2 / 3, [2, 3])
    assert s["decisions"] == {"new": 2, "affinity": 2, "fallback_busy": 1}
    assert (s["prefix_cache_hit_rate"], s["prefix_cache"]) == (0.75, [3, 4])
    assert (s["cached_share_later"], s["cached_tokens_later"]) == (300 / 700, [300, 700])


def test_the_routing_stacks_alternate_from_affinity_and_run_under_their_policy():
    stacks = list(fb.POLICIES)
    assert [fb.rotated(stacks, i) for i in range(3)] == [stacks, stacks[::-1], stacks]
    assert [fb.POLICIES[s] for s in stacks] == ["affinity", "first-free"]


def test_the_routing_conversations_of_a_round_share_one_system_prompt_and_each_open_with_its_task():
    sizes = {**fb.ROUTING_QUICK, "output_lines": 2}
    a, b = fb.routing_sessions(0, sizes), fb.routing_sessions(1, sizes)
    assert len(a) == 4 and all(len(s.turns) == 3 and s.arrival_s == 0 for s in a)
    assert len({s.turns[0].messages[0]["content"] for s in a}) == 1 and len({s.turns[0].messages[1]["content"] for s in a}) == 4
    assert a[0].turns[0].messages[0] != b[0].turns[0].messages[0]  # every round its own system prompt
    assert a[0].turns[0].think_s == 0 and a[0].turns[1].follow_up.endswith("\n\nopen the failing test")


def test_the_proxys_request_lines_are_read_by_request_id_and_other_lines_skipped(tmp_path):
    log = tmp_path / "proxy.log"
    line = {"event": "request", "request_id": "r1", "worker": "w1", "routing": "affinity"}
    log.write_text("\n".join([json.dumps({"event": "listening"}), "not json", json.dumps(line)]))
    assert fb.request_lines(log) == {"r1": {"event": "request", "request_id": "r1", "worker": "w1", "routing": "affinity"}}


def routing_report(comparison, prefix_cache=None):
    s = {"ttft_turn1_s": {"median": 1.5, "min": 1.2, "max": 2.0, "n": 4}, "ttft_later_s": {"median": 0.25, "min": 0.2, "max": 0.41, "n": 8},
         "prompt_tokens": {"median": 900, "min": 700, "max": 1100, "n": 12}, "affinity_hit_rate": 0.875, "affinity_hits": [7, 8],
         "decisions": {"affinity": 7, "new": 4, "fallback_busy": 1}, "prefix_cache_hit_rate": 0.5 if prefix_cache else None,
         "prefix_cache": prefix_cache, "ttft_later_per_run_s": [0.25], "cached_share_later": 0.5, "cached_tokens_later": [450, 900]}
    sizes = {**fb.ROUTING_QUICK, "pause": 0.3}
    return {"meta": {"sizes": sizes}, "summary": {"policies": {"affinity": s, "first-free": s}, "comparison": comparison, "notes": ["n"]}}


def test_the_routing_table_shows_medians_with_spread_hit_rates_and_says_when_no_cache_is_there():
    lines = fb.routing_lines(routing_report(None))
    assert lines[0] == ("4 conversations x 3 turns through the proxy, 2 workers of width 2, 8 answer tokens, "
                        "tool pauses 0.3 s on average, 1 round(s) per policy, alternated")
    assert "  TTFT turns 2+   0.25 s (0.20-0.41, n=8)" in lines
    assert "  affinity hits   88% (7 of 8) of turns 2+ on the previous turn's worker" in lines
    assert "  routing         affinity 7, fallback_busy 1, new 4" in lines
    assert "  cached tokens   50% (450 of 900) of turns 2+'s prompt tokens" in lines
    assert "  prefix cache    - (the workers export no prefix-cache series)" in lines
    assert "  prefix cache    50% (2 of 4)" in fb.routing_lines(routing_report(None, prefix_cache=[2, 4]))
    assert lines[-2:] == ["comparison: n/a", "note: n"]


def test_the_routing_comparison_says_too_few_passes_or_not_significant_before_any_ratio():
    few = fb.routing_lines(routing_report({"decision": "too few passes", "ratio": None, "lo": None, "hi": None, "n": [1, 1]}))
    assert "comparison: too few passes (1 and 1 runs; 3 each needed): rerun with --rounds 3 or more" in few
    ns = fb.routing_lines(routing_report({"decision": "not significant", "ratio": 1.04, "lo": 0.9, "hi": 1.2, "n": [3, 3]}))
    assert any(line.startswith("comparison: not significant: TTFT turns 2+, first-free / affinity 1.04x (0.90-1.20") for line in ns)
    win = fb.routing_lines(routing_report({"decision": "adopt", "ratio": 6.0, "lo": 4.0, "hi": 9.0, "n": [3, 3]}))
    assert any(line.startswith("comparison: affinity answers sooner: TTFT turns 2+, first-free / affinity 6.00x") for line in win)


def test_compare_policies_refuses_a_verdict_on_fewer_than_three_runs_a_side():
    policies = {"affinity": {"ttft_later_per_run_s": [0.2]}, "first-free": {"ttft_later_per_run_s": [1.0]}}
    assert fb.compare_policies(policies)["decision"] == "too few passes"
    policies = {"affinity": {"ttft_later_per_run_s": [0.2, 0.21, 0.19]}, "first-free": {"ttft_later_per_run_s": [1.0, 1.1, 0.9]}}
    c = fb.compare_policies(policies)
    assert c["decision"] == "adopt" and c["ratio"] == 5.0


# -- end to end: both modes on the demo pair as it is ------------------------------------------------


def run_quick(tmp_path, *args):
    pytest.importorskip("mlx.core", reason="a real run needs mlx (Linux: pip install 'mlx[cpu]')")
    report, done = run_bench("fleet_bench", tmp_path, "--quick", *args, timeout=900, written="fleet.json")
    return report, done.stderr


def test_a_quick_run_starts_each_stack_and_answers_every_turn(tmp_path):
    stacks = ["mtpstack", "nginx"] if fb.nginx_program() else ["mtpstack"]
    report, stderr = run_quick(tmp_path, "--sessions", "2", "--turns", "2", "--stacks", *stacks)
    assert {r["stack"] for r in report["rows"]} == set(stacks) and all(r["status"] == "ok" for r in report["rows"])
    assert all(r["worker"] in ("w0", "w1") for r in report["rows"] if r["stack"] == "mtpstack")  # the proxy's log read
    (run,) = [x for x in report["runs"] if x["stack"] == "mtpstack"]
    assert run["workers"]["prefix_cache_lookups"] > 0 and set(run["cpu_s"]) == {"proxy `proxy`", "worker `w0`",
                                                                                  "worker `w1`"}
    assert report["summary"]["stacks"]["mtpstack"]["ttft_p95"]["median"] > 0
    assert "goal: zero errors, 429s and timeouts for mtpstack: met" in stderr
    assert (tmp_path / "ttft-by-turn.png").stat().st_size > 5000


def test_a_quick_routing_run_reports_both_policies(tmp_path):
    report, stderr = run_quick(tmp_path, "--routing")
    assert set(report["summary"]["policies"]) == {"affinity", "first-free"}
    assert report["summary"]["policies"]["affinity"]["affinity_hits"][1] == 8  # 4 conversations x turns 2-3
    assert "comparison: too few passes" in stderr
