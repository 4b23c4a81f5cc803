"""The sweep's pure parts and its refusals (no worker is started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpstack import series
from mtpstack.bench import sweep as sw
from mtpstack.bench.stats import DEFAULT_REPEATS
from mtpstack.cli import main
from mtpstack.proxy.prometheus import unlabelled
from mtpstack.validator import load_valid_config
from mtpstack.worker.proof import read_cmdline

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "valid" / "fleet.yaml"


@pytest.fixture
def example():
    return load_valid_config(EXAMPLE)


@pytest.mark.parametrize("text,depths", [("1-6", [1, 2, 3, 4, 5, 6]), ("1,2,4", [1, 2, 4]), ("2-3,6,3", [2, 3, 6])])
def test_depths_are_read_as_ranges_and_lists(text, depths):
    assert sw.parse_depths(text) == depths


@pytest.mark.parametrize("text", ["", "a", "4-2", "1-"])
def test_unreadable_depths_are_refused_with_an_example(text):
    with pytest.raises(sw.SweepError) as e:
        sw.parse_depths(text)
    assert e.value.hint is None or "1-6" in e.value.hint


def test_the_plan_puts_the_baseline_first_and_measures_it_once(example):
    configs, base = sw.plan(example, "qwen-mtp", [1, 2, 3], "configured")
    assert base.label == "depth auto"  # the example drafts at `auto`
    assert [c.label for c in configs] == ["depth auto", "depth 1", "depth 2", "depth 3"]
    configs, base = sw.plan(example, "qwen-mtp", [1, 2], "no-drafter")
    assert [c.label for c in configs] == ["no-drafter", "depth 1", "depth 2"]


def test_an_alternated_sweep_with_auto_runs_one_auto_worker_that_reaches_every_fixed_depth(example):
    configs, _ = sw.plan(example, "qwen-mtp", [1, 6], "configured")
    profile = sw.alternated_profile(example.workers["qwen-mtp"], configs)
    assert (profile.drafter.depth, profile.drafter.max_depth) == ("auto", 6)
    assert [c.request_fields for c in configs] == [None, {"num_draft_tokens": 1}, {"num_draft_tokens": 6}]
    # Without `auto` among them: the deepest fixed depth, as before.
    fixed = sw.alternated_profile(example.workers["qwen-mtp"], [sw.Configuration.of(2), sw.Configuration.of(4)])
    assert fixed.drafter.depth == 4


def test_an_unknown_worker_gets_a_did_you_mean(example):
    with pytest.raises(sw.SweepError) as e:
        sw.plan(example, "qwen-mpt", [1], "configured")
    assert e.value.hint == "did you mean `qwen-mtp`?"


def test_a_depth_the_rules_forbid_stops_the_sweep_naming_the_rule(example):
    with pytest.raises(sw.SweepError) as e:
        sw.check_reachable(example, "qwen-mtp", sw.Configuration.of(9), "fleet.yaml")
    assert "configuration `depth 9` is forbidden by the fleet's rules: out-of-range" in e.value.message
    sw.check_reachable(example, "qwen-mtp", sw.Configuration.of(8), "fleet.yaml")  # allowed


def test_a_port_of_the_fleet_is_refused(example):
    with pytest.raises(sw.SweepError) as e:
        sw.ensure_isolated(example, "127.0.0.1", 8101)
    assert "refusing to bench on port 8101: it belongs to the fleet" in e.value.message
    with pytest.raises(sw.SweepError):
        sw.ensure_isolated(example, "127.0.0.1", 8080)  # the proxy
    port = sw.pick_port(example)
    assert port not in (8080, 8101)
    sw.ensure_isolated(example, "127.0.0.1", port)


def test_counters_are_read_from_prometheus_text():
    text = (
        "# HELP mtpstack_worker_tokens_drafted_total Tokens proposed.\n"
        "# TYPE mtpstack_worker_tokens_drafted_total counter\n"
        "mtpstack_worker_tokens_drafted_total 42.0\n"
        "mtpstack_worker_tokens_drafted_created 1.7e9\n"
        "mtpstack_worker_tokens_accepted_total 30.0\n"
        'mtpstack_worker_accepted_by_position_total{position="1"} 20.0\n'
    )
    assert unlabelled(text, sw.COUNTERS) == {series.TOKENS_DRAFTED: 42.0, series.TOKENS_ACCEPTED: 30.0}


def test_a_pass_sums_requests_and_takes_acceptance_from_counter_deltas():
    reqs = [
        {"tokens": 10, "seconds": 1.0, "decode_s": 0.9, "ttft_s": 0.1},
        {"tokens": 21, "seconds": 2.0, "decode_s": 1.8, "ttft_s": 0.2},
        {"tokens": 1, "seconds": 0.3, "decode_s": 0.0, "ttft_s": 0.3},
    ]
    p = sw.summarize_pass(reqs, {series.TOKENS_DRAFTED: 100, series.TOKENS_ACCEPTED: 50}, {series.TOKENS_DRAFTED: 140, series.TOKENS_ACCEPTED: 80})
    assert p["tokens"] == 32
    assert p["e2e_tps"] == pytest.approx(32 / 3.3)
    assert p["decode_tps"] == pytest.approx(29 / 2.7)
    assert p["ttft_s"] == 0.2
    assert (p["drafted"], p["accepted"], p["acceptance"]) == (40, 30, 0.75)
    assert p["target_steps"] is None and p["step_ms"] is None  # a worker without the step counter


def test_time_per_target_step_is_decode_time_over_the_step_counter_delta():
    reqs = [{"tokens": 10, "seconds": 1.0, "decode_s": 0.9, "ttft_s": 0.1}]
    p = sw.summarize_pass(reqs, {series.TARGET_STEPS: 5}, {series.TARGET_STEPS: 14, series.TOKENS_DRAFTED: 0})
    assert p["target_steps"] == 9 and p["step_ms"] == pytest.approx(100.0)
    assert unlabelled("mtpstack_worker_target_steps_total 7.0\n", sw.COUNTERS) == {series.TARGET_STEPS: 7.0}


@pytest.mark.parametrize("workload", ["code", "prose"])
def test_shipped_prompt_sets_have_8_to_16_short_unique_prompts(workload):
    prompts = sw.load_prompts(workload)
    assert 8 <= len(prompts) <= 16
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(len(p.prompt) < 200 for p in prompts)


def test_an_unknown_workload_names_the_known_ones():
    with pytest.raises(sw.SweepError) as e:
        sw.load_prompts("poetry")
    assert "code" in e.value.hint and "prose" in e.value.hint


def test_the_cli_reports_user_mistakes_in_one_sentence_with_a_hint(capsys, tmp_path):
    code = main(["bench", "sweep", "--config", str(EXAMPLE), "--worker", "qwen-mpt", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "error: no worker named `qwen-mpt` in the config\n\nhint: did you mean `qwen-mtp`?" in err
    assert "Traceback" not in err


def test_the_cli_stops_before_starting_anything_when_a_depth_is_forbidden(capsys, tmp_path):
    code = main(["bench", "sweep", "--config", str(EXAMPLE), "--worker", "qwen-mtp", "--depths", "7-9", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 1 and "`depth 9` is forbidden by the fleet's rules: out-of-range" in err
    assert not (tmp_path / "o").exists()


def _results(values: list[float]) -> dict:
    passes = [{"e2e_tps": v, "requests": []} for v in values]
    return {"schema": "mtpstack-bench/1", "meta": {"worker": "w"}, "settings": {"workloads": ["code"]}, "baseline": "depth 2",
            "configurations": [{"label": "depth 2", "depth": 2, "status": "measured", "workloads": {"code": {"passes": passes}}}]}


def test_compare_reads_two_files_and_applies_the_rule(capsys, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_results([20.0, 21.0, 22.0])))
    b.write_text(json.dumps(_results([21.0, 22.0, 20.5])))
    assert main(["bench", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"code: {b} `depth 2` vs {a} `depth 2`: not significant: keep the default; ratio" in out


def test_report_of_a_missing_file_is_a_plain_error(capsys, tmp_path):
    assert main(["bench", "report", str(tmp_path / "nope.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no such results file:") and "hint:" in err


def test_the_default_repeats_come_from_the_simulation_table():
    assert DEFAULT_REPEATS == 10


def _sse_app(events: list[bytes], status: int = 200):
    from aiohttp import web

    async def chat(request):
        if status != 200:
            return web.json_response({"error": {"message": "nope", "code": "x"}}, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"delta": {"content": text}}]}).encode() + b"\n\n"


async def test_a_streamed_answer_is_timed_and_counted_from_its_usage(aiohttp_server):
    import aiohttp

    usage = b"data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 5}}).encode() + b"\n\n"
    server = await aiohttp_server(_sse_app([_chunk("he"), _chunk("llo"), usage, b"data: [DONE]\n\n"]))
    async with aiohttp.ClientSession() as session:
        r = await sw.run_request(session, str(server.make_url("")).rstrip("/"), "m", sw.Prompt("p1", "hi"), 8)
    assert r["tokens"] == 5 and r["prompt_id"] == "p1"
    assert r["output_sha256"] == __import__("hashlib").sha256(b"hello").hexdigest()
    assert 0 < r["ttft_s"] <= r["seconds"]


async def test_without_usage_the_content_chunks_are_counted(aiohttp_server):
    import aiohttp

    server = await aiohttp_server(_sse_app([_chunk("a"), _chunk("b"), _chunk("c"), b"data: [DONE]\n\n"]))
    async with aiohttp.ClientSession() as session:
        r = await sw.run_request(session, str(server.make_url("")).rstrip("/"), "m", sw.Prompt("p", "hi"), 8)
    assert r["tokens"] == 3


@pytest.mark.parametrize("status,events", [(429, []), (200, [b'data: {"error": {"message": "generation failed: boom"}}\n\n'])])
async def test_an_error_answer_aborts_the_configuration(aiohttp_server, status, events):
    import aiohttp

    server = await aiohttp_server(_sse_app(events, status))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(sw.ConfigurationAborted) as e:
            await sw.run_request(session, str(server.make_url("")).rstrip("/"), "m", sw.Prompt("p", "hi"), 8)
    assert "prompt `p`" in str(e.value)


def _with_kind(example, kind: str):
    profile = example.workers["qwen-mtp"]
    return profile.model_copy(update={"drafter": profile.drafter.model_copy(update={"kind": kind})})


@pytest.fixture
def sleeping_worker():
    """Starts a process whose command line is a profile's worker argv (it only sleeps); its pid."""
    from contextlib import ExitStack

    from tests.sleeping_process import sleeping_process
    from mtpstack.validator import worker_argv

    with ExitStack() as stack:
        yield lambda profile: stack.enter_context(sleeping_process(worker_argv(profile))).pid


@pytest.mark.parametrize(
    ("declared", "reported", "recorded"),
    [("mtp", "model", None), ("mtp", "mtp", "mtp"), ("auto", "model", "model"), ("auto", "mtp", "mtp"),
     ("mtp", None, "mtp"), ("model", None, "model")],  # a worker that does not report it: its command line's
)
def test_the_weights_proof_refuses_a_declared_kind_the_worker_did_not_load_and_records_the_resolved_one(
        example, sleeping_worker, declared, reported, recorded):
    profile = _with_kind(example, declared)
    pid = sleeping_worker(profile)
    drafter = {"path": profile.drafter.path} | ({"kind": reported} if reported else {})
    identity = {"pid": pid, "argv": read_cmdline(pid), "target": {"path": profile.target.path}, "drafter": drafter,
                "draft_depth": profile.drafter.depth}
    expected = sw.Expected(profile, None, None)
    if recorded is not None:
        proof = sw.check_weights(pid, "http://unused", expected, fetch=lambda url: identity)
        assert (proof["identity"], proof["drafter_kind"]) == (identity, recorded)
    else:
        with pytest.raises(sw.ConfigurationAborted) as e:
            sw.check_weights(pid, "http://unused", expected, fetch=lambda url: identity)
        assert str(e.value) == "the weights proof failed: drafter kind (/identity): asked for 'mtp', the process has 'model'"


def test_extra_passes_go_to_a_side_of_the_undecided_settling_comparison_only(example):
    sweep = sw.Sweep.__new__(sw.Sweep)
    sweep.s = type("S", (), {"margin": 0.05})()

    def measured(label, depth, values):
        passes = [{"e2e_tps": v} for v in values]
        return {"label": label, "depth": depth, "status": "measured", "workloads": {"code": {"passes": passes}}}

    sweep.results = {"baseline": "no-drafter", "configurations": [
        measured("no-drafter", None, [300.0, 310.0, 320.0]), measured("depth 2", 2, [560.0, 585.0, 640.0])]}

    def open_(label, depth, values):  # every one clearly adopted against the baseline: only settling can ask for more
        return sweep._open([sw.Configuration(label, depth)], [measured(label, depth, values)], "code")

    # depth 3 is the best so far and undecided against depth 2: it gets passes.
    assert open_("depth 3", 3, [600.0, 660.0, 700.0])
    # A clearly slower configuration is no side of it.
    assert not open_("depth 1", 1, [400.0, 401.0, 402.0])
    # Decided (far above): no more passes.
    assert not open_("depth 3", 3, [900.0, 901.0, 902.0, 903.0])
