"""A real worker process against hostile requests: each is refused with a 400 naming its field,
and the process stays up with every slot free."""

from __future__ import annotations

import json
import random
import urllib.request

import pytest

from devkit.hostile import random_body, random_http
from devkit.raw_http import json_answer, raw_exchange, request_bytes
from tests.openai_shape import check_unknown_route

CHAT = [{"role": "user", "content": "hi"}]
#: The tiny pair's vocabulary (`build_tiny_pair`'s config.json).
VOCAB = 1024
FUZZ_SEED, FUZZ_COUNT = 7, 150


@pytest.fixture(scope="module")
def worker(tiny_pair, tmp_path_factory, live_worker_class):
    w = live_worker_class(tmp_path_factory.mktemp("hostile"), *tiny_pair, depth=2, width=2)
    with w:
        yield w


def raw(text: str) -> bytes:
    return text.encode()


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        # Token ids past the vocabulary crashed the process (segfault) or answered 500 `std::bad_cast`.
        ("/v1/completions", {"prompt": [2147483648]}, "prompt"),
        ("/v1/completions", {"prompt": [100000000]}, "prompt"),
        ("/v1/completions", {"prompt": [VOCAB]}, "prompt"),
        ("/v1/completions", {"prompt": [-1, -2]}, "prompt"),
        ("/v1/completions", {"prompt": [1000000000000]}, "prompt"),
        # Seeds outside [0, 2^63) answered 500.
        ("/v1/completions", {"prompt": "x", "seed": -1}, "seed"),
        ("/v1/completions", {"prompt": "x", "seed": 2**63}, "seed"),
        ("/v1/completions", {"prompt": "x", "seed": 2**70}, "seed"),
        # NaN and infinities compare false with every bound and were accepted.
        ("/v1/completions", raw('{"prompt": "x", "temperature": NaN}'), "temperature"),
        ("/v1/completions", raw('{"prompt": "x", "temperature": Infinity}'), "temperature"),
        ("/v1/completions", raw('{"prompt": "x", "top_p": NaN}'), "top_p"),
        ("/v1/completions", raw('{"prompt": "x", "temperature": 1e400}'), "temperature"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2**31}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "num_draft_tokens": -1}, "num_draft_tokens"),
        ("/v1/completions", {"prompt": "x", "n": 2**70}, "n"),
        # Lone surrogates make the tokenizer raise a TypeError.
        ("/v1/completions", raw('{"prompt": "\\ud800"}'), "prompt"),
        ("/v1/chat/completions", raw('{"messages": [{"role": "user", "content": "\\udfff"}]}'), "messages"),
        ("/v1/chat/completions", raw('{"messages": [{"role": "\\ud800", "content": "x"}]}'), "messages"),
        ("/v1/chat/completions", raw('{"messages": [{"role": "user", "content": "x"}], "stop": ["\\ud800"]}'), "stop"),
        ("/v1/chat/completions", {"messages": CHAT, "stream": "yes"}, "stream"),
        ("/v1/chat/completions", {"messages": CHAT, "ignore_eos": "no"}, "ignore_eos"),
        ("/v1/chat/completions", {"messages": CHAT, "stream_options": {"include_usage": "yes"}}, "stream_options"),
        ("/v1/chat/completions", {"messages": CHAT, "model": ["tiny"]}, "model"),
    ],
)
def test_a_field_out_of_bounds_is_refused_naming_the_field(worker, path, body, param):
    status, headers, payload = worker.post_json(path, body)
    assert (status, payload["error"]["code"], payload["error"]["param"]) == (400, "invalid_request", param), payload
    assert headers["X-Request-Id"]


@pytest.mark.parametrize(
    "body",
    [
        raw("[" * 50_000 + "]" * 50_000),
        raw('{"prompt": "x", "max_tokens": ' + "9" * 5000 + "}"),
        raw('{"prompt": ' + "[" * 65 + "1" + "]" * 65 + "}"),
        b"\xff\xfe{",
        b"",
    ],
    ids=["50k-nested-brackets", "5000-digit-integer", "65-levels", "not-utf8", "empty"],
)
def test_an_unreadable_body_is_a_400_not_aiohttps_bare_500(worker, body):
    status, _, payload = worker.post_json("/v1/completions", body)
    assert (status, payload["error"]["code"]) == (400, "invalid_request"), payload


def test_the_last_token_id_of_the_vocabulary_and_the_largest_seed_are_served(worker):
    status, _, payload = worker.post_json("/v1/completions", {"prompt": [VOCAB - 1, 0], "max_tokens": 3, "seed": 2**63 - 1,
                                                              "temperature": 1.0})
    assert status == 200, payload
    assert payload["usage"]["prompt_tokens"] == 2


def test_the_worker_echoes_the_request_id_it_was_given(worker):
    import urllib.request

    req = urllib.request.Request(worker.url + "/v1/completions", data=json.dumps({"prompt": [-1]}).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": "proxy-rid-42"})
    try:
        urllib.request.urlopen(req, timeout=30)
    except urllib.error.HTTPError as e:
        assert e.code == 400 and e.headers["X-Request-Id"] == "proxy-rid-42"
    else:
        pytest.fail("a negative token id was served")


@pytest.mark.parametrize(
    ("path", "method", "status", "code"),
    [("/nope", "GET", 404, "not_found"), ("/v1/chat/completions/x", "POST", 404, "not_found"),
     ("/v1/chat/completions", "GET", 405, "method_not_allowed"), ("/health", "DELETE", 405, "method_not_allowed")],
)
def test_an_unknown_path_or_method_is_answered_in_the_openai_error_shape(worker, path, method, status, code):
    check_unknown_route(worker.url, path, method, status, code)


def test_a_10_kb_class_header_is_a_400_naming_it(worker):
    # aiohttp's parser refused it (8,190 bytes) in plain text, naming nothing.
    headers = {"Content-Type": "application/json", "X-Mtpstack-Class": "a" * 10_000}
    body = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
    status, _, payload = json_answer(worker.url + "/v1/completions", "POST", headers, body)
    assert (status, payload["error"]["param"]) == (400, "X-Mtpstack-Class"), payload


def test_generated_malformed_http_and_odd_json_get_no_5xx_and_no_hang(worker):
    rng = random.Random(FUZZ_SEED)
    port = int(worker.url.rsplit(":", 1)[1])
    statuses = []
    for _ in range(FUZZ_COUNT):
        path = rng.choice(["/v1/completions", "/v1/chat/completions"])
        data = random_http(rng, path, model="tiny") if rng.random() < 0.4 else request_bytes(path, random_body(rng, "tiny"))
        got = raw_exchange("127.0.0.1", port, data, timeout=60)
        assert not got.timed_out, data[:200]
        statuses.append(got.status)
    assert not [s for s in statuses if s is not None and s >= 500], statuses
    assert worker.proc.alive()


def test_after_all_of_that_the_process_is_alive_and_every_slot_free(worker):
    # Runs last in this module (pytest keeps file order): the requests above all went to this process.
    assert worker.proc.alive()
    health = worker.get_json("/health")
    assert (health["status"], health["active"]) == ("ok", 0)
    # aiohttp's refusals of malformed HTTP are logged in one line each, without a traceback.
    log = worker.proc.log_path.read_text()
    assert "Error handling request" in log and "Traceback" not in log
    # The worker logs as the proxy does (`mtpstack.logs`): one JSON object per line.
    assert all(isinstance(json.loads(line), dict) for line in log.splitlines())
