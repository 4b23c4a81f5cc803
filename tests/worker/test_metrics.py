"""The worker's per-position counters: drafted and accepted tokens by draft position."""

from __future__ import annotations

from prometheus_client import generate_latest

from mtpstack.proxy.fleet import acceptance
from mtpstack.proxy.prometheus import parse_samples
from mtpstack.worker.metrics import Metrics


def test_each_step_counts_its_drafts_and_acceptances_at_their_positions():
    m = Metrics(max_depth=3)
    m.record_step(drafted=3, accepted=1, tokens=2)  # 1 accepted, 2 rejected: 3 was drafted and counts as not accepted
    m.record_step(drafted=3, accepted=3, tokens=4)
    m.record_step(drafted=2, accepted=0, tokens=1)  # a shorter draft near the token limit
    a = acceptance(parse_samples(generate_latest(m.registry).decode()))
    assert [(p["position"], p["drafted"], p["accepted"]) for p in a["by_position"]] == [(1, 3.0, 2.0), (2, 3.0, 1.0), (3, 2.0, 1.0)]
    assert (a["drafted"], a["accepted"]) == (8.0, 4.0)


def test_every_position_up_to_the_depth_is_exported_before_any_step():
    text = generate_latest(Metrics(max_depth=2).registry).decode()
    for position in ("1", "2"):
        assert f'mtpstack_worker_drafted_by_position_total{{position="{position}"}} 0.0' in text
