"""The endpoint table (`mtpstack.endpoints`) is what both services serve: the worker routes each row
to a handler speaking its API, the proxy forwards each row's path and counts its prompt for routing."""

from __future__ import annotations

from mtpstack.endpoints import ENDPOINTS
from mtpstack.proxy.app import create_app as proxy_app
from mtpstack.proxy.routing import UNITS, affinity_keys
from mtpstack.refusals import ERROR_BODIES
from mtpstack.validator import FleetConfig
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.handlers import SURFACES
from mtpstack.worker.server import create_app as worker_app


def posted(app) -> set[str]:
    return {r.resource.canonical for r in app.router.routes() if r.method == "POST"}


def test_the_worker_and_the_proxy_take_exactly_the_tables_paths():
    paths = {e.path for e in ENDPOINTS}
    assert posted(worker_app(WorkerConfig(model="m"))) == paths
    assert posted(proxy_app(FleetConfig())) == paths


def test_every_row_has_a_worker_surface_a_routing_count_and_an_error_shape():
    for e in ENDPOINTS:
        assert e.api in SURFACES and e.units in UNITS and e.family in ERROR_BODIES, e.path
        assert e.path.startswith("/v1/")


def test_a_rows_units_key_the_routing_of_its_prompt():
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "next"}]
    chat = affinity_keys("/v1/chat/completions", {"messages": turns})
    responses = affinity_keys("/v1/responses", {"input": turns})
    # The same messages are the same units on both APIs, wherever they sit in the body.
    assert chat.record == responses.record and len(chat.record) == 3
    assert affinity_keys("/v1/completions", {"messages": turns}).record == []  # a completion's prompt is `prompt`
