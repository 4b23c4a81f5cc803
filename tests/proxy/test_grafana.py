"""The example Grafana dashboard names only metrics the stack exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mtpstack.proxy.metrics import ProxyMetrics
from mtpstack.worker.metrics import Metrics as WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "mtpstack-dashboard.json"
#: Anything that looks like one of the stack's metric names, wherever it stands in an expression.
NAME = re.compile(r"\bmtpstack_[a-zA-Z0-9_:]+")


#: The sample names each kind of family exposes, whether or not it has a labelled child yet.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "summary": ("_sum", "_count", "")}


def exported() -> set[str]:
    """Every sample name the proxy and a worker with a drafter of depth 3 expose."""
    names = set()
    for registry in (ProxyMetrics().registry, WorkerMetrics(3).registry):
        for family in registry.collect():
            names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
            names |= {s.name for s in family.samples}
    return names


def expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


def test_every_expression_names_only_metrics_the_stack_exports():
    known = exported()
    exprs = expressions()
    assert exprs
    for expr in exprs:
        names = NAME.findall(expr)
        assert names, f"names no mtpstack metric: {expr}"
        unknown = [n for n in names if n not in known]
        assert not unknown, f"not exported: {unknown} in `{expr}`"


def test_the_check_catches_a_misspelt_metric():
    assert "mtpstack_proxy_refusal_total" not in exported()
    assert "mtpstack_proxy_refusals_total" in exported()
