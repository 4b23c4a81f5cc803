"""`GET /v1/fleet/status` and `/dashboard` against real aiohttp upstreams (`devkit.fake_upstream`)
that answer `/identity` and `/metrics` like the native worker."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mtpstack.proxy.fleet import WorkerTrack, acceptance, prefix_cache, spread, weights_check
from mtpstack.proxy.prometheus import parse_samples
from tests.proxy.conftest import fleet_config
from mtpstack.validator import worker_argv
from mtpstack.validator.config import DrafterSpec


def identity_of(gate: int, pid: int = 100, started_at: float = 1000.0, argv: list[str] | None = None) -> dict:
    """What a native worker loaded from `/models/m` with `--max-num-seqs gate` reports."""
    profile = fleet_config({"w1": 1}, {"w1": {"gate": gate}}).workers["w1"]
    return {
        "pid": pid,
        "started_at": started_at,
        "max_num_seqs": gate,
        "target": {"path": "/models/m", "bits": 4, "sha256": "ab" * 32, "bits_mismatch": None},
        "drafter": None,
        "draft_depth": None,
        "argv": argv if argv is not None else ["/usr/bin/python3", "-m", *worker_argv(profile)],
    }


WORKER_METRICS = """\
# TYPE mtpstack_worker_tokens_generated counter
mtpstack_worker_tokens_generated_total 40.0
# TYPE mtpstack_worker_tokens_drafted counter
mtpstack_worker_tokens_drafted_total 30.0
# TYPE mtpstack_worker_tokens_accepted counter
mtpstack_worker_tokens_accepted_total 12.0
# TYPE mtpstack_worker_accepted_by_position counter
mtpstack_worker_accepted_by_position_total{position="1"} 8.0
mtpstack_worker_accepted_by_position_total{position="2"} 4.0
# TYPE mtpstack_worker_drafted_by_position counter
mtpstack_worker_drafted_by_position_total{position="1"} 15.0
mtpstack_worker_drafted_by_position_total{position="2"} 15.0
# TYPE mtpstack_worker_active_sequences gauge
mtpstack_worker_active_sequences 1.0
# TYPE mtpstack_worker_drafter_info gauge
mtpstack_worker_drafter_info{bundled="true",depth="2",kind="mtp"} 1.0
"""


async def wait_for(predicate, what: str, timeout: float = 5.0):
    # Bounded: collections run every 50 ms here, so a few hundred ms is the usual wait.
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


async def status_of(f, headers=None) -> dict:
    r = await f.client.get("/v1/fleet/status", headers=headers or {})
    assert r.status == 200, await r.text()
    return await r.json()


# -- pure parts ---------------------------------------------------------------------------
def test_a_spread_is_median_min_max_and_count_never_a_lone_figure():
    assert spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    assert spread([]) is None


def test_acceptance_by_position_divides_accepted_by_drafted_at_that_position():
    a = acceptance(parse_samples(WORKER_METRICS))
    assert a["rate"] == pytest.approx(12 / 30)
    assert [(p["position"], p["accepted"], p["drafted"]) for p in a["by_position"]] == [(1, 8.0, 15.0), (2, 4.0, 15.0)]
    assert a["by_position"][0]["rate"] == pytest.approx(8 / 15)


PREFIX_CACHE_METRICS = """\
# TYPE mtpstack_worker_prefix_cache_lookups counter
mtpstack_worker_prefix_cache_lookups_total 8.0
# TYPE mtpstack_worker_prefix_cache_hits counter
mtpstack_worker_prefix_cache_hits_total 6.0
# TYPE mtpstack_worker_prefix_cache_tokens_reused counter
mtpstack_worker_prefix_cache_tokens_reused_total 12000.0
# TYPE mtpstack_worker_prefix_cache_evictions counter
mtpstack_worker_prefix_cache_evictions_total 1.0
# TYPE mtpstack_worker_prefix_cache_bytes gauge
mtpstack_worker_prefix_cache_bytes 1048576.0
"""


def test_the_prefix_cache_hit_rate_is_hits_over_lookups_and_absent_without_the_series():
    c = prefix_cache(parse_samples(WORKER_METRICS + PREFIX_CACHE_METRICS))
    assert c == {"lookups": 8.0, "hits": 6.0, "tokens_reused": 12000.0, "evictions": 1.0, "bytes": 1048576.0, "hit_rate": 0.75,
                 "disk_hits": None, "disk_errors": None, "disk_bytes": None, "disk_hit_rate": None}  # no disk tier
    assert prefix_cache(parse_samples(WORKER_METRICS)) is None


DISK_METRICS = """# TYPE mtpstack_worker_prefix_cache_disk_hits counter
mtpstack_worker_prefix_cache_disk_hits_total 2.0
# TYPE mtpstack_worker_prefix_cache_disk_errors counter
mtpstack_worker_prefix_cache_disk_errors_total 0.0
# TYPE mtpstack_worker_prefix_cache_disk_bytes gauge
mtpstack_worker_prefix_cache_disk_bytes 3221225472.0
"""


def test_the_disk_hit_rate_is_the_lookups_resumed_from_disk():
    c = prefix_cache(parse_samples(WORKER_METRICS + PREFIX_CACHE_METRICS + DISK_METRICS))
    assert (c["disk_hits"], c["disk_hit_rate"], c["disk_bytes"], c["disk_errors"]) == (2.0, 0.25, 3 * 2**30, 0.0)
    assert prefix_cache(parse_samples("mtpstack_worker_prefix_cache_lookups_total 0\n"))["hit_rate"] is None


def test_the_prefix_cache_series_read_are_the_ones_the_worker_exports():
    from mtpstack.proxy.fleet import PREFIX_CACHE_SERIES
    from tests.proxy.test_grafana import exported

    assert set(PREFIX_CACHE_SERIES.values()) <= exported()


def test_a_restart_is_a_new_pid_or_start_time_and_the_first_sighting_is_not_one():
    t = WorkerTrack()
    assert not t.saw_identity({"pid": 1, "started_at": 5.0})
    assert not t.saw_identity({"pid": 1, "started_at": 5.0})
    assert t.saw_identity({"pid": 2, "started_at": 9.0})
    assert t.saw_identity({"pid": 2, "started_at": 11.0})  # the same pid reused by a new process
    assert t.restarts == 2


def test_tokens_per_second_leaves_idle_seconds_out():
    t = WorkerTrack()
    for now, total in ((0.0, 0.0), (1.0, 30.0), (2.0, 30.0), (3.0, 50.0)):
        t.saw_generated(now, total)
    assert [r for _, r in t.rates] == [30.0, 20.0]


def test_weights_agree_when_identity_matches_the_argv_the_config_implies():
    profile = fleet_config({"w1": 1}, {"w1": {"gate": 2}}).workers["w1"]
    assert weights_check(profile, identity_of(2)) == []


def test_a_worker_started_by_hand_with_another_width_disagrees_with_its_config():
    profile = fleet_config({"w1": 1}, {"w1": {"gate": 2}}).workers["w1"]
    found = weights_check(profile, identity_of(4))
    assert any(m == "maxNumSeqs: config `2`, /identity `4`" for m in found)
    assert any(m == "maxNumSeqs: config `2`, its own command line `4`" for m in found)


def test_other_weights_than_the_config_names_are_flagged():
    profile = fleet_config({"w1": 1}, {"w1": {"gate": 1}}).workers["w1"]
    other = identity_of(1) | {"target": {"path": "/models/other", "sha256": "cd" * 32}}
    assert any(m == "target: config `/models/m`, /identity `/models/other`" for m in weights_check(profile, other))


def test_a_draft_depth_the_proxys_config_has_not_seen_is_no_disagreement_but_other_weights_are():
    # Editing a worker's depth restarts that worker, not the proxy (docs/nix.md), so the proxy's copy of
    # the config may hold the old depth: only what the proxy acts on is held against the worker.
    base = fleet_config({"w1": 1}, {"w1": {"gate": 1}}).workers["w1"]
    profile = base.model_copy(update={"drafter": DrafterSpec(path="/models/head", bits=6, depth=3, kind="mtp")})
    identity = identity_of(1) | {
        "drafter": {"path": "/models/head", "kind": "mtp"}, "draft_depth": 5, "draft_depth_map": {"code": 6},
        "argv": ["/usr/bin/python3", "-m", *worker_argv(profile.model_copy(update={"drafter": profile.drafter.model_copy(update={"depth": {"default": 5, "code": 6}})}))],
    }  # fmt: skip
    assert weights_check(profile, identity) == []
    other_head = identity | {"drafter": {"path": "/models/other-head", "kind": "mtp"}}
    assert "drafter: config `/models/head`, /identity `/models/other-head`" in weights_check(profile, other_head)


# -- the endpoint -------------------------------------------------------------------------
async def test_the_status_shows_each_worker_as_its_identity_and_metrics_report_it(make_fleet):
    f = await make_fleet({"w1": {"gate": 2, "identity": identity_of(2), "metrics": WORKER_METRICS}})
    s = await status_of(f)
    w = s["workers"]["w1"]
    assert s["schema"] == 1 and s["ok"] is True and s["problems"] == []
    assert w["healthy"] is True and w["pid"] == 100 and w["restarts"] == 0
    assert w["weights"]["agrees"] is True and w["weights"]["target"]["hash"] == "ab" * 6
    assert w["width"] == {"max_num_seqs": 2, "active": 1}
    assert w["draft_depth"] == 2
    assert w["coupling"]["agrees"] is True
    assert s["models"]["m"]["gate"] == [2] and s["models"]["m"]["queued"] == 0


async def test_an_auto_worker_shows_auto_not_the_depth_its_head_is_loaded_at(make_fleet):
    f = await make_fleet({"w1": {"gate": 2, "identity": identity_of(2) | {"draft_depth": "auto"}, "metrics": WORKER_METRICS}})
    assert "depth=\"2\"" in WORKER_METRICS  # the drafter series says 2 (the deepest it drafts)
    assert (await status_of(f))["workers"]["w1"]["draft_depth"] == "auto"


async def test_the_status_shows_the_affinity_hit_rate_per_model_beside_each_workers_prefix_cache(make_fleet):
    f = await make_fleet({"w1": {"gate": 1, "identity": identity_of(1), "metrics": WORKER_METRICS + PREFIX_CACHE_METRICS},
                          "w2": {"gate": 1, "metrics": WORKER_METRICS}})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "c"}
    for _ in range(3):
        assert (await f.client.post("/v1/chat/completions", json=body)).status == 200
    s = await wait_for(lambda: f.collector.snapshot["models"]["m"]["routing"]["decisions"]["affinity"] == 2 and f.collector.snapshot,
                       "the routed requests in the status")
    assert s["models"]["m"]["routing"] == {"policy": "affinity", "decisions": {"affinity": 2, "fallback_busy": 0, "new": 1}, "hit_rate": 1.0}
    assert s["workers"]["w1"]["prefix_cache"]["hit_rate"] == 0.75
    assert s["workers"]["w2"]["prefix_cache"] is None  # no prefix-cache series: shown as absent


async def test_a_worker_whose_width_differs_from_the_gate_is_flagged(make_fleet):
    # The proxy's gate is 2; the worker was restarted by hand with `--max-num-seqs 1`.
    f = await make_fleet({"w1": {"gate": 1, "proxy_gate": 2, "identity": identity_of(1)}})
    s = await status_of(f)
    c = s["workers"]["w1"]["coupling"]
    assert (c["gate"], c["width"], c["agrees"]) == (2, 1, False)
    assert s["ok"] is False and any("the proxy's gate is 2 but the worker serves 1" in p for p in s["problems"])


async def test_a_restart_is_counted_when_the_worker_reports_a_new_pid(make_fleet):
    f = await make_fleet({"w1": {"gate": 1, "identity": identity_of(1, pid=100)}})
    await wait_for(lambda: f.collector.tracks["w1"].pid == 100, "the first identity")
    f.fakes["w1"].identity = identity_of(1, pid=200, started_at=2000.0)
    await wait_for(lambda: f.collector.tracks["w1"].restarts == 1, "the restart to be seen")
    w = (await status_of(f))["workers"]["w1"]
    assert (w["pid"], w["restarts"]) == (200, 1)


async def test_a_worker_without_identity_is_shown_unchecked_not_as_agreeing(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    w = (await status_of(f))["workers"]["w1"]
    assert w["weights"]["agrees"] is None and w["coupling"]["agrees"] is None
    assert w["identity_error"] == "/identity answered 404"


async def test_mlx_lm_workers_are_not_asked_for_routes_they_lack(make_fleet):
    f = await make_fleet({"w1": {"gate": 1, "backend": "mlx-lm"}})
    await wait_for(lambda: f.collector.rounds >= 3, "a few collections")
    assert (f.fakes["w1"].identity_requests, f.fakes["w1"].metrics_requests) == (0, 0)
    w = (await status_of(f))["workers"]["w1"]
    assert w["weights"]["checked"] is False and w["identity_error"] == "mlx_lm.server has no /identity"


async def test_readers_do_not_cause_collections_however_many_there_are(make_fleet):
    f = await make_fleet({"w1": {"gate": 1, "identity": identity_of(1)}}, fleet_interval=3600)
    bodies = await asyncio.gather(*(status_of(f) for _ in range(20)))
    assert {b["rounds"] for b in bodies} == {1}
    assert f.fakes["w1"].identity_requests == 1


async def test_refusals_are_counted_by_code_in_the_status_and_in_metrics(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"queue": {"maxWaiting": 0}})
    slow = asyncio.create_task(f.client.post("/v1/chat/completions", json={"model": "m", "messages": [], "x_fake": {"hold": "slot"}}))
    await wait_for(lambda: f.state.upstreams["w1"].inflight == 1, "the first request to hold the slot")
    r = await f.client.post("/v1/chat/completions", json={"model": "m", "messages": []})
    f.fakes["w1"].release("slot")
    assert r.status == 429
    assert (await f.client.post("/v1/chat/completions", data=b"{")).status == 400
    await slow
    await wait_for(lambda: f.collector.snapshot["models"]["m"]["refusals"].get("queue_full"), "a collection after the refusal")
    assert (await status_of(f))["models"]["m"]["refusals"] == {"queue_full": 1}
    text = await (await f.client.get("/metrics")).text()
    assert 'mtpstack_proxy_refusals_total{code="queue_full",model="m"} 1.0' in text
    assert 'mtpstack_proxy_refusals_total{code="invalid_request",model="-"} 1.0' in text


async def test_time_to_first_token_is_taken_at_the_first_chunk_not_the_head(make_fleet):
    f = await make_fleet({"w1": {"gate": 1}})
    # The fake sends its head at once, then its first chunk 0.2 s later.
    body = {"model": "m", "messages": [], "stream": True, "x_fake": {"chunks": 2, "first_after": 0.2}}
    r = await f.client.post("/v1/chat/completions", json=body)
    await r.read()
    text = await (await f.client.get("/metrics")).text()
    assert 'mtpstack_proxy_time_to_first_token_seconds_count{worker="w1"} 1.0' in text
    # The head came at once, the first chunk not before 0.2 s: measured at the head it would fall under 0.1 s.
    assert 'mtpstack_proxy_time_to_first_token_seconds_bucket{le="0.1",worker="w1"} 0.0' in text
    ttft = await wait_for(lambda: f.collector.snapshot["workers"]["w1"]["time_to_first_token_seconds"], "a collection")
    assert ttft["n"] == 1 and ttft["median"] >= 0.2


@pytest.fixture
def keys_file(tmp_path):
    p = tmp_path / "keys"
    p.write_text("sk-dash-key\n")
    return str(p)


async def test_the_status_needs_the_key_and_the_page_does_not(make_fleet, keys_file, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    f = await make_fleet({"w1": {"gate": 1}}, proxy={"apiKeysFile": keys_file})
    assert (await f.client.get("/v1/fleet/status")).status == 401
    assert (await f.client.get("/v1/fleet/status", headers={"Authorization": "Bearer sk-wrong"})).status == 401
    await status_of(f, {"Authorization": "Bearer sk-dash-key"})
    page = await f.client.get("/dashboard")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    assert "/v1/fleet/status" in html and "key-form" in html
    assert "http://" not in html and "https://" not in html  # nothing loaded from elsewhere: works offline
    assert "sk-dash-key" not in caplog.text


def test_the_live_depth_is_read_from_the_series_the_worker_exports():
    from types import SimpleNamespace

    from prometheus_client import generate_latest

    from mtpstack.worker.depth_policy import DepthPolicy, StepCosts
    from mtpstack.worker.metrics import Metrics

    from mtpstack.proxy.fleet import live_depth

    metrics = Metrics(max_depth=3)
    costs = StepCosts(2, 3)
    for depth, seconds in enumerate([0.010, 0.013, 0.015, 0.018]):
        costs.seed(2, depth, seconds)
    policy = DepthPolicy(3, 2, costs)
    policy.choose([3, 1], [None, None], [[0.9] * 3, [0.9] * 3])
    for depth, rows in ((2, [2, 1]), (3, [3, 1, 0]), (3, [3, 1])):  # a third row came and went
        metrics.draft_depth(SimpleNamespace(last_depth=depth, last_plans=rows), 1, policy)
    d = live_depth(parse_samples(generate_latest(metrics.registry).decode()))
    assert d["depth"] == 3 and d["rows"] == [3, 1]
    assert d["steps_by_depth"] == {"2": 1.0, "3": 2.0}
    assert d["step_seconds"] == pytest.approx({"0": 0.010, "1": 0.013, "2": 0.015, "3": 0.018})
    assert len(d["acceptance_estimate"]) == 3
    assert live_depth(parse_samples(WORKER_METRICS)) is None  # a worker without the series
