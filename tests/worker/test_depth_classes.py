"""A depth per workload class (`--draft-depth-map`): the class a request gets, the depth it drafts at,
its series on /metrics, and the map on /identity and in the weights proof; a real worker on loopback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from mtpstack.worker.classify import classify_request, classify_text
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.http import ApiError
from mtpstack.worker.parsing import request_class

MAP = {"code": 4, "prose": 1, "default": 2}


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        ("Write a haiku about the sea", "prose"),
        ("Here:\n```\nx = 1\n```", "code"),
        ("def main():\n    return 1\n", "code"),
        ("import os\nimport sys\n", "code"),
        ("int main() {\n  return 0;\n}\n", "code"),
        ("She said she would return before dawn.\nThe sea was calm.\nNobody waited.", "prose"),
    ],
)
def test_the_classifier_tells_code_from_prose(text, cls):
    assert classify_text(text) == cls


@pytest.mark.parametrize("workload", ["code", "prose"])
def test_the_bench_prompt_sets_are_classified_as_their_workload(workload):
    # Requests *for* code ("Write a Python function ...") hold no code themselves.
    from mtpstack.bench.sweep import load_prompts

    chats = [{"messages": [{"role": "user", "content": p.prompt}]} for p in load_prompts(workload)]
    assert {classify_request(c) for c in chats} == {workload}


def test_tools_or_a_schema_make_a_request_code():
    chat = {"messages": [{"role": "user", "content": "What is the weather?"}]}
    assert classify_request(chat) == "prose"
    assert classify_request({**chat, "tools": [{"type": "function", "function": {"name": "f"}}]}) == "code"
    assert classify_request({**chat, "response_format": {"type": "json_schema", "json_schema": {}}}) == "code"
    assert classify_request({"messages": [{"role": "user", "content": [{"type": "text", "text": "```py\n```"}]}]}) == "code"


def test_the_body_field_wins_over_the_header_and_the_header_over_the_classifier():
    config = WorkerConfig(model="m", draft_depth=2, draft_depth_map={"code": 4, "tools": 5})
    body = {"prompt": "def f():\n    return 1\n"}
    assert request_class(body, None, config) == "code"
    assert request_class(body, "tools", config) == "tools"
    assert request_class({**body, "mtpstack_class": "prose"}, "tools", config) == "prose"
    # A class the map does not list counts as `default`: clients cannot mint metric series.
    assert request_class({**body, "mtpstack_class": "x" * 10}, None, config) == "default"
    with pytest.raises(ApiError) as e:
        request_class({**body, "mtpstack_class": "a b"}, None, config)
    assert (e.value.status, e.value.param) == (400, "mtpstack_class")
    with pytest.raises(ApiError) as e:
        request_class(body, "a,b", config)
    assert e.value.param == "X-Mtpstack-Class"


def _metrics(worker) -> dict[str, float]:
    with urllib.request.urlopen(worker.url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(mtpstack_worker_\S+?)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


@pytest.fixture(scope="module")
def worker(echo_pair, tmp_path_factory, live_worker_class):
    # The echo pair's drafter is its target: every drafted token is accepted, so a step emits depth + 1 tokens.
    w = live_worker_class(tmp_path_factory.mktemp("classes"), *echo_pair, depth=MAP, width=2)
    with w:
        yield w


def test_identity_and_the_weights_proof_carry_the_map(worker):
    ident = worker.get_json("/identity")
    assert (ident["draft_depth"], ident["draft_depth_map"]) == (2, {"code": 4, "prose": 1})
    assert "--draft-depth-map" in ident["argv"] and "code=4,prose=1" in ident["argv"]
    proof = subprocess.run([sys.executable, "-m", "mtpstack", "weights", worker.url, "--format", "json"],
                           capture_output=True, text=True, timeout=60)
    assert proof.returncode == 0, proof.stderr
    report = json.loads(proof.stdout)
    assert report["problems"] == [] and report["claim"]["depth_map"] == {"code": 4, "prose": 1}


def test_each_class_drafts_at_its_depth_counts_in_its_series_and_gives_the_same_text(worker):
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True}
    texts, steps, drafted = {}, {}, {}
    for cls in ("code", "prose", "default"):
        before = _metrics(worker)
        _, _, answer = worker.post_json("/v1/completions", {**body, "mtpstack_class": cls})
        after = _metrics(worker)
        texts[cls] = answer["choices"][0]["text"]
        steps[cls] = after["mtpstack_worker_target_steps_total"] - before["mtpstack_worker_target_steps_total"]
        series = f'mtpstack_worker_tokens_drafted_by_class_total{{class="{cls}"}}'
        drafted[cls] = after[series] - before.get(series, 0)
        assert drafted[cls] == answer["usage"]["draft_tokens"], cls
        accepted = f'mtpstack_worker_tokens_accepted_by_class_total{{class="{cls}"}}'
        assert after[accepted] - before.get(accepted, 0) == drafted[cls], cls  # the echo drafter is always right
        position = 'mtpstack_worker_accepted_by_position_total{position="%d"}'
        # No draft of this class reaches past its depth, and the deepest position of its depth is used.
        depth = MAP[cls]
        assert after[position % depth] > before[position % depth], cls
        if depth < 4:
            assert after[position % (depth + 1)] == before[position % (depth + 1)], cls
        requests = f'mtpstack_worker_requests_by_class_total{{class="{cls}"}}'
        assert after[requests] - before.get(requests, 0) == 1
    assert texts["code"] == texts["prose"] == texts["default"]
    # 23 tokens after the prefill's first, depth + 1 per step.
    assert steps == {"code": 5, "prose": 12, "default": 8}


def test_the_time_in_steps_is_counted_beside_the_steps_and_within_the_request(worker):
    steps, seconds = "mtpstack_worker_target_steps_total", "mtpstack_worker_target_step_seconds_total"
    before = _metrics(worker)
    started = time.perf_counter()
    worker.post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True})
    wall = time.perf_counter() - started
    after = _metrics(worker)
    assert after[steps] - before[steps] > 0
    # The steps alone: more than nothing, less than the request took from the client's side.
    assert 0 < after[seconds] - before[seconds] < wall
    idle = _metrics(worker)
    assert idle[seconds] == after[seconds]  # an idle worker adds nothing


def test_num_draft_tokens_still_lowers_a_class_depth(worker):
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, "mtpstack_class": "code"}
    before = _metrics(worker)
    worker.post_json("/v1/completions", {**body, "num_draft_tokens": 1})
    after = _metrics(worker)
    assert after["mtpstack_worker_target_steps_total"] - before["mtpstack_worker_target_steps_total"] == 12


def test_the_classifier_picks_the_class_when_the_request_names_none(worker):
    before = _metrics(worker)
    worker.post_json("/v1/completions", {"prompt": "def main():\n    return 1\n", "max_tokens": 4})
    after = _metrics(worker)
    series = 'mtpstack_worker_requests_by_class_total{class="code"}'
    assert after[series] - before.get(series, 0) == 1


@pytest.mark.parametrize("value", ["code=x", "code", "a b=2", "code=0", "code=17"])
def test_a_malformed_depth_map_fails_before_loading(tiny_pair, value):
    run = subprocess.run(
        [sys.executable, "-m", "mtpstack", "worker", "--model", str(tiny_pair[0]), "--draft-model", str(tiny_pair[1]),
         "--draft-depth-map", value],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 1 and "`--draft-depth-map`" in run.stderr, run.stderr
