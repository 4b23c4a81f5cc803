"""`mtpstack proxy` as a process against malformed HTTP, odd JSON and slow clients: every
refusal a 4xx (never a 5xx caused by the input), every log line one JSON object, every slow
client cut off by `proxy.timeouts.clientSeconds`, and nothing held afterwards."""

from __future__ import annotations

import json
import random
import urllib.request

import pytest

from devkit.fake_fleet import proxy_before_fake
from devkit.hostile import MALFORMED_HTTP, random_agent_request, random_body, random_http, random_messages_request
from devkit.raw_http import SLOW_KINDS, json_answer, raw_exchange, request_bytes, slow_client
from tests.openai_shape import check_unknown_route

#: The deadline under test, short so that slow clients are cut off quickly.
CLIENT_SECONDS = 1.0
#: Longest a slow client may be held: the deadline plus a margin for a busy 2-core machine.
#: A dripping client under an idle timer would be held forever, so any finite bound shows it.
HELD_AT_MOST = CLIENT_SECONDS + 8.0
FUZZ_SEED, FUZZ_COUNT = 11, 150


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with proxy_before_fake(tmp_path_factory.mktemp("hostile-proxy"), CLIENT_SECONDS) as running:
        yield running


def _log(proxy) -> list[dict]:
    lines = proxy.log.read_text().splitlines()
    parsed = []
    for line in lines:
        entry = json.loads(line)  # every line is one JSON object: this raises otherwise
        assert isinstance(entry, dict), line
        parsed.append(entry)
    return parsed


@pytest.mark.parametrize("name", sorted(MALFORMED_HTTP))
def test_malformed_http_is_refused_with_a_400(proxy, name):
    got = raw_exchange("127.0.0.1", proxy.port, MALFORMED_HTTP[name])
    # aiohttp refuses most with 400; a few it reads as another path (404) or closes outright.
    assert got.status in (None, 400, 404, 413, 431) and not got.timed_out, got


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"model": "m", "prompt": ' + b"[" * 65 + b"1" + b"]" * 65 + b"}",
        b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b"}",
    ],
    ids=["50k-nested", "65-levels", "5000-digits"],
)
def test_a_body_too_deep_or_with_a_number_too_long_is_a_400(proxy, body):
    assert raw_exchange("127.0.0.1", proxy.port, request_bytes("/v1/completions", body)).status == 400


@pytest.mark.parametrize("kind", SLOW_KINDS)
def test_a_slow_client_is_cut_off_by_the_deadline_however_it_drips(proxy, kind):
    got = slow_client("127.0.0.1", proxy.port, kind, interval=0.05, bound=HELD_AT_MOST)
    assert not got.timed_out, f"{kind}: still held after {HELD_AT_MOST} s"
    assert got.seconds >= CLIENT_SECONDS * 0.9  # cut by the deadline, not refused outright
    # A late body is answered 408; a late (or absent) head has no answer, its connection is closed.
    assert got.status == (408 if kind in ("drip-body", "short-body", "endless-chunks") else None), got


@pytest.mark.parametrize(
    ("path", "method", "status", "code"),
    [("/nope", "GET", 404, "not_found"), ("/v1/embeddings", "POST", 404, "not_found"),
     ("/v1/chat/completions", "GET", 405, "method_not_allowed"), ("/v1/models", "POST", 405, "method_not_allowed")],
)
def test_an_unknown_path_or_method_is_answered_in_the_openai_error_shape(proxy, path, method, status, code):
    check_unknown_route(f"http://127.0.0.1:{proxy.port}", path, method, status, code)


def test_a_10_kb_class_header_reaches_the_worker_which_names_it(proxy):
    # The proxy's parser refused it (aiohttp's 8,190 bytes) in plain text; the worker now refuses
    # it naming `X-Mtpstack-Class` (tests/worker/test_hostile.py), and this fake worker answers.
    headers = {"Content-Type": "application/json", "X-Mtpstack-Class": "a" * 10_000}
    body = json.dumps({"model": "m", "prompt": "x"}).encode()
    status, _, _ = json_answer(f"http://127.0.0.1:{proxy.port}/v1/completions", "POST", headers, body)
    assert status == 200


def statuses_of(proxy, requests) -> list[int | None]:
    """The proxy's status for each raw request, none of them held past `HELD_AT_MOST`."""
    statuses = []
    for data in requests:
        got = raw_exchange("127.0.0.1", proxy.port, data, timeout=HELD_AT_MOST)
        assert not got.timed_out
        statuses.append(got.status)
    return statuses


def test_generated_malformed_requests_get_no_5xx_and_no_hang(proxy):
    rng = random.Random(FUZZ_SEED)
    statuses = statuses_of(proxy, (random_http(rng) if rng.random() < 0.5 else request_bytes("/v1/completions", random_body(rng))
                                   for _ in range(FUZZ_COUNT)))
    assert not [s for s in statuses if s is not None and s >= 500], statuses


def test_generated_hostile_agent_requests_get_no_5xx_and_no_hang(proxy):
    # The proxy passes tools, schemas and Responses items to its worker unread: what it must not
    # do is fail on them (this fake worker answers whatever reaches it).
    rng = random.Random(FUZZ_SEED)
    statuses = statuses_of(proxy, (request_bytes(*random_agent_request(rng)) for _ in range(FUZZ_COUNT // 3)))
    assert not [s for s in statuses if s is None or s >= 500], statuses


def test_generated_hostile_messages_requests_get_no_5xx_and_no_hang(proxy):
    rng = random.Random(FUZZ_SEED)
    statuses = statuses_of(proxy, (request_bytes(*random_messages_request(rng)) for _ in range(FUZZ_COUNT // 3)))
    assert not [s for s in statuses if s is None or s >= 500], statuses


def test_afterwards_the_proxy_is_alive_holds_nothing_and_logged_only_json(proxy):
    # Runs last in this module: everything above went to this process.
    assert proxy.proxy.alive()
    ready = _get_json(f"http://127.0.0.1:{proxy.port}/readyz")
    assert ready["workers"]["w"]["inflight"] == 0 and ready["models"]["m"]["waiting"] == 0
    entries = _log(proxy)
    requests = [e for e in entries if e.get("event") == "request"]
    assert not [e for e in requests if e["status"] >= 500], [e for e in requests if e["status"] >= 500]
    late_heads = [e for e in requests if e["status"] == 408 and e["path"] is None]
    assert late_heads and all(e["code"] == "client_timeout" for e in late_heads)
    # aiohttp's own refusals of malformed HTTP are in the log too, as JSON, with the parser's
    # error and without its traceback (the client's mistake, not the proxy's).
    aiohttp_errors = [e for e in entries if e.get("event") == "log" and e["logger"].startswith("aiohttp")]
    assert aiohttp_errors and all("BadHttpMessage" in e["message"] or "Error" in e["message"] for e in aiohttp_errors)
    assert not [e for e in aiohttp_errors if "traceback" in e]
