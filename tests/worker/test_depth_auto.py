"""`--draft-depth auto` on a real worker (the bundled demo pair, on loopback): the worker calibrates before
it serves, chooses each step's depth, tells which on /metrics and /identity, and answers as a fixed depth does."""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys

import pytest

from mtpstack import series
from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

PROMPTS = ["def fibonacci(n):", "The history of the lighthouse", '{"name": "get_weather", "arguments": {"city": "']


def _samples(worker) -> dict[str, dict[str, float]]:
    """Series name -> {label value (or ""): value}, for the series with at most one label."""
    out: dict[str, dict[str, float]] = {}
    for line in worker.get_text("/metrics").splitlines():
        m = re.match(r'^(mtpstack_worker_\w+?)(?:\{\w+="([^"]*)"\})? (\S+)$', line)
        if m:
            out.setdefault(m.group(1), {})[m.group(2) or ""] = float(m.group(3))
    return out


@pytest.fixture(scope="module")
def worker(tmp_path_factory, live_worker_class):
    w = live_worker_class(tmp_path_factory.mktemp("auto"), DEMO_TARGET, DEMO_HEAD, depth="auto", width=2, name="demo")
    with w:
        yield w


def _complete(worker, prompt: str, **extra) -> dict:
    status, _, answer = worker.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 40, "temperature": 0,
                                                             "ignore_eos": True, **extra})
    assert status == 200, answer
    return answer


def test_identity_says_auto_and_the_weights_proof_agrees(worker):
    ident = worker.get_json("/identity")
    assert ident["draft_depth"] == "auto"
    argv = ident["argv"]
    assert argv[argv.index("--draft-depth") + 1] == "auto" and argv[argv.index("--draft-max-depth") + 1] == "4"
    proof = subprocess.run([sys.executable, "-m", "mtpstack", "weights", worker.url, "--format", "json"],
                           capture_output=True, text=True, timeout=60)
    assert proof.returncode == 0, proof.stderr
    assert json.loads(proof.stdout)["problems"] == []


def test_step_costs_are_measured_before_the_first_request(worker):
    # Module order: this runs before any request of this module; the calibration's steps are not requests.
    costs = _samples(worker)[series.VERIFY_STEP_SECONDS]
    assert sorted(costs) == ["0", "1", "2", "3", "4"]
    assert all(s > 0 for s in costs.values())


def test_greedy_text_under_auto_is_the_plain_decoders_alone_and_side_by_side(worker):
    plain = {p: _complete(worker, p, num_draft_tokens=0)["choices"][0]["text"] for p in PROMPTS}
    before = _samples(worker)
    alone = {p: _complete(worker, p) for p in PROMPTS}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        together = dict(zip(PROMPTS, pool.map(lambda p: _complete(worker, p)["choices"][0]["text"], PROMPTS)))
    after = _samples(worker)
    assert {p: a["choices"][0]["text"] for p, a in alone.items()} == plain == together
    steps = {d: n - before[series.DRAFT_DEPTH_STEPS].get(d, 0) for d, n in after[series.DRAFT_DEPTH_STEPS].items()}
    target_steps = after["mtpstack_worker_target_steps_total"][""] - before["mtpstack_worker_target_steps_total"][""]
    # Every decode step is counted once, at a depth the policy may choose (0 to maxDepth).
    assert sum(steps.values()) == target_steps and set(steps) <= {"0", "1", "2", "3", "4"}
    # A row drafts the step's depth or less (what is left of its max_tokens): never more than the steps allow.
    drafted = sum(a["usage"]["draft_tokens"] for a in alone.values())
    assert 0 < drafted <= sum(int(d) * n for d, n in steps.items())
    estimate = after[series.DRAFT_ACCEPTANCE_ESTIMATE]
    assert sorted(estimate) == ["1", "2", "3", "4"] and all(0 <= v <= 1 for v in estimate.values())
    assert 0 <= after[series.DRAFT_DEPTH][""] <= 4


def test_a_request_that_names_its_depth_keeps_it(worker):
    before = _samples(worker)[series.DRAFT_DEPTH_STEPS]
    answer = _complete(worker, PROMPTS[0], num_draft_tokens=2)
    after = _samples(worker)[series.DRAFT_DEPTH_STEPS]
    ran = {d for d, n in after.items() if n > before.get(d, 0)}
    # One row alone with a fixed depth: every decode step at it (the last may draft less, near max_tokens).
    assert "2" in ran and ran <= {"0", "1", "2"}
    assert answer["usage"]["draft_tokens"] > 0
