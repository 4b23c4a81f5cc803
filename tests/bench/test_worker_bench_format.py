"""The worker bench's pure summaries: medians with spread, ratios of medians, readable lines."""

from __future__ import annotations

import pytest

from devkit.scripts import load_script
from mtpstack.bench.parts import fmt, spread

wb = load_script("worker_bench")


def test_summaries_keep_the_spread():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([])["median"] is None
    assert fmt(spread([1.0, 2.0, 4.0])) == "2.00 (1.00-4.00, n=3)"


def test_a_ratio_needs_both_medians():
    assert wb.ratio({"median": 3.0}, {"median": 2.0}) == 1.5
    assert wb.ratio({"median": None}, {"median": 2.0}) is None


def run(decode_s: float, tokens: int, steps: int) -> dict:
    return {"decode_s": decode_s, "tokens": tokens, "steps": steps}


def test_report_lines_name_every_configuration_and_every_drafted_ones_step_cost():
    s = spread([10.0])
    single = {"native+mtp": [run(1.6, 9, 4)], "native": [run(1.0, 9, 8)],
              "mlx-vlm+mtp": [run(2.0, 9, 4)], "mlx-vlm": [run(1.6, 9, 8)]}
    summary = {
        "single": {"native+mtp": {"tok_s": s, "ttft_s": s}},
        "speedup": {"native": 1.2, "mlx-vlm": None},
        "step_costs": wb.step_costs(single),
        "acceptance": 0.5,
        "concurrent": {"native+mtp": {"aggregate_tok_s": s, "ttft_median_s": s, "ttft_max_s": s}},
        "goals": {"aggregate at 4: native+mtp / mlx_lm.server (goal >= 1)": 1.25},
        "notes": ["only 1 repeats"],
    }
    text = "\n".join(wb.report_lines(summary))
    assert "native+mtp" in text and "1.200x" in text and "n/a" in text and "1.25" in text
    lines = text.splitlines()
    assert any(line.split()[:2] == ["native+mtp", "3.20"] and "2.00 (2.00-2.00, n=1) tokens per step" in line
               and "(400.0 ms (400.0-400.0, n=1) a step)" in line for line in lines)
    assert any(line.split()[:2] == ["mlx-vlm+mtp", "2.50"] for line in lines)  # the reference's step priced alike
    assert "acceptance per drafted token (native+mtp's usage): 0.50" in text
    assert lines[-1] == "note: only 1 repeats"


def test_a_step_cost_is_a_step_with_the_head_over_a_token_without_it_round_by_round():
    # round 1: 0.4 s per step against 0.125 s per token; round 2: 0.3 against 0.1
    single = {"native+mtp": [run(1.6, 9, 4), run(0.9, 7, 3)], "native": [run(1.0, 9, 8), run(0.6, 7, 6)]}
    c = wb.step_costs(single)["native+mtp"]
    assert c["step_cost"]["min"] == 3.0 and c["step_cost"]["max"] == 3.2
    assert c["tokens_per_step"]["min"] == 2.0 and c["tokens_per_step"]["max"] == 2.0
    assert c["speedup"]["median"] == (2.0 / 3.2 + 2.0 / 3.0) / 2
    assert c["step_ms"]["max"] == 400.0 and c["step_ms"]["min"] == 300.0
    assert "mlx-vlm+mtp" not in wb.step_costs(single)  # no reference measured: no line for it


def test_decode_steps_come_from_the_references_rounds_else_from_the_usage():
    assert wb.decode_steps({"completion_tokens": 64, "accepted_draft_tokens": 31}) == 32  # 1 + 32 steps x (1 + ~1)
    assert wb.decode_steps({"completion_tokens": 64}) == 63  # no head: a step per token after the first
    assert wb.decode_steps({"completion_tokens": 64}, {"draft_rounds": 25, "draft_n": 75}) == 25
    assert wb.decode_steps({"completion_tokens": 1}) is None
    # The native worker's own count wins: an answer that ended at its end of turn after accepting
    # drafts past it is counted short by the usage (12 tokens, 7 accepted: 4 steps by the usage, 6 in fact).
    assert wb.decode_steps({"completion_tokens": 12, "accepted_draft_tokens": 7}) == 4
    assert wb.decode_steps({"completion_tokens": 12, "accepted_draft_tokens": 7}, None, 6.0) == 6


def test_the_step_inside_the_worker_is_summarised_beside_the_step_seen_by_the_client():
    single = {"native+mtp": [{**run(1.6, 9, 4), "step_s": 1.2}, {**run(0.9, 7, 3), "step_s": 0.6}],
              "native": [run(1.0, 9, 8), run(0.6, 7, 6)]}
    c = wb.step_costs(single)["native+mtp"]
    assert (c["step_ms_inside"]["min"], c["step_ms_inside"]["max"]) == pytest.approx((200.0, 300.0))
    assert (c["step_ms"]["min"], c["step_ms"]["max"]) == (300.0, 400.0)
    lines = wb.report_lines({"single": {}, "speedup": {}, "concurrent": {}, "step_costs": {"native+mtp": c}})
    # Tokens a step count the end of turn the last step chose where the usage leaves it out.
    chosen = {"native+mtp": [{**run(1.6, 9, 4), "chosen": 10}], "native": [run(1.0, 9, 8)]}
    assert wb.step_costs(chosen)["native+mtp"]["tokens_per_step"]["median"] == 9 / 4
    assert any("in the worker's step itself (its /metrics): 250.0 ms (200.0-300.0, n=2)" in line for line in lines)


def test_without_a_baseline_build_the_default_configurations_leave_its_configuration_out():
    assert "native+mtp@baseline" not in wb.default_configs(None)
    assert set(wb.default_configs(None)) == {"native+mtp", "native", "mlx-vlm+mtp", "mlx-vlm", "mlx_lm.server"}
    assert "native+mtp@baseline" in wb.default_configs("/tmp/old/bin/mtpstack")


def test_single_stream_ttft_is_reported_apart_for_prefix_cache_hits_and_whole_prefills():
    runs = [{"tok_s": 10.0, "ttft_s": 0.5, "cached_tokens": 0}, {"tok_s": 12.0, "ttft_s": 0.7, "cached_tokens": 0},
            {"tok_s": 11.0, "ttft_s": 0.05, "cached_tokens": 9}]
    s = wb.single_summary(runs)
    assert s["ttft_s"]["n"] == 3 and s["ttft_cold_s"]["median"] == 0.6 and s["ttft_hit_s"]["median"] == 0.05
    lines = wb.report_lines({"single": {"native+mtp": s}, "speedup": {}, "concurrent": {}})
    assert any("from the prefix cache 0.050 s" in line and "prefilled whole 0.600 s" in line for line in lines)


async def test_with_stop_at_end_every_request_lets_the_server_end_the_answer_at_its_end_of_turn(aiohttp_server):
    import json

    import aiohttp
    from aiohttp import web

    bodies = []

    async def chat(request):
        bodies.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + json.dumps({"choices": [{"delta": {"content": "hi"}}]}).encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 1}}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as session:
        await wb.stream_one(session, url, "p", 8, "m")
        await wb.stream_one(session, url, "p", 8, "m", ignore_eos=False)
        await wb.concurrent(session, url, 2, 8, "m", ignore_eos=False)
    assert [b["ignore_eos"] for b in bodies] == [True, False, False, False]
