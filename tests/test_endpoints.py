"""The endpoint table (`mtpstack.endpoints`) is what both services serve: the worker routes each row
to a handler speaking its API, the proxy forwards each row's path and counts its prompt for routing."""

from __future__ import annotations

from mtpstack.endpoints import ENDPOINTS
from mtpstack.proxy.app import create_app as proxy_app
from mtpstack.proxy.routing import UNITS, affinity_keys
from mtpstack.refusals import ERROR_BODIES, stream_error
from mtpstack.validator import FleetConfig
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.handlers import SURFACES
from mtpstack.worker.http import generation_failed
from mtpstack.worker.protocol.messages_answer import MessageBuilder
from mtpstack.worker.protocol.messages_answer import usage as messages_usage
from mtpstack.worker.protocol.responses import ResponseBuilder
from mtpstack.worker.protocol.responses import usage as responses_usage
from mtpstack.worker.server import create_app as worker_app
from mtpstack.worker.sse import DONE, frame


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


def test_the_worker_ends_each_apis_streams_with_an_event_the_proxy_takes_as_final():
    # As the worker frames its last events (`mtpstack.worker.answers`): a client has its whole answer
    # once one went out, so the proxy counts it as answered even if the client leaves right then.
    def named(events: list[dict]) -> bytes:
        return frame(events[-1], event=events[-1]["type"])

    def failed(api: str, family: str = "openai") -> bytes:
        name, data = stream_error(api, 500, "generation_failed", "boom", 3, family)
        return frame(data, event=name)

    openai = [DONE, frame(generation_failed("boom", "r").body())]
    ends = {
        "chat": openai,
        "completions": openai,
        "responses": [named(ResponseBuilder(None, "m", {}).finish(reason, responses_usage(1, 1))) for reason in ("stop", "length")]
                     + [failed("responses")],
        "messages": [named(MessageBuilder(None, "m").finish("stop", messages_usage(1, 1))), failed("messages", "anthropic")],
    }
    for e in ENDPOINTS:
        for event in ends[e.api]:
            assert event.startswith(e.final_events), (e.path, event[:60])
