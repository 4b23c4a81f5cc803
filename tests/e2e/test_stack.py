"""The whole stack as `mtpstack up` starts it, driven with the official `openai` client.

The tests share one stack and run in file order: the fault tests come last.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import http.client
import json
import socket
from urllib.parse import urlsplit
import openai
import pytest

from tests.e2e.conftest import alive, get_json, get_text, metric, wait_until



def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.proxy_url + "/v1", api_key="unused", timeout=60, max_retries=0)


def test_responses_and_logprobs_answer_through_the_proxy_like_the_worker(stack):
    c = client(stack)
    r = c.responses.create(model="tiny", input="def add(a, b):", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.usage.output_tokens == 8
    direct = openai.OpenAI(base_url=stack.worker_url("w0") + "/v1", api_key="unused", timeout=60, max_retries=0)
    assert direct.responses.create(model="tiny", input="def add(a, b):", max_output_tokens=8, temperature=0).output_text == r.output_text
    streamed = "".join(e.delta for e in c.responses.create(model="tiny", input="def add(a, b):", max_output_tokens=8,
                                                          temperature=0, stream=True) if e.type == "response.output_text.delta")
    assert streamed == r.output_text
    with pytest.raises(openai.BadRequestError) as refused:
        c.responses.create(model="tiny", input="x", previous_response_id="resp_1")
    assert refused.value.body["param"] == "previous_response_id"
    lp = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
                                   logprobs=True, top_logprobs=2)
    assert len(lp.choices[0].logprobs.content) == lp.usage.completion_tokens


def test_hostile_agent_input_is_a_400_naming_its_field_through_the_proxy(stack):
    # Each was a 500 with a traceback, a plain-text 400 or a plain-text 404 before issue 23.
    c = client(stack)
    hi = {"role": "user", "content": "hi"}
    deep = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "[" * 50_000 + "]" * 50_000}}]}
    with pytest.raises(openai.BadRequestError) as refused:
        c.chat.completions.create(model="tiny", messages=[hi, deep], max_tokens=2)
    assert refused.value.body["param"] == "messages[1].tool_calls[0].function.arguments"
    with pytest.raises(openai.BadRequestError) as refused:
        c.chat.completions.create(model="tiny", messages=[hi], max_tokens=2, extra_headers={"X-Mtpstack-Class": "a" * 10_000})
    assert refused.value.body["param"] == "X-Mtpstack-Class"
    with pytest.raises(openai.NotFoundError) as missing:
        c.post("/embeddings", body={"model": "tiny", "input": "x"}, cast_to=object)
    assert missing.value.body["code"] == "not_found"


def test_models_list_names_the_served_model(stack):
    models = client(stack).models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_a_model_is_retrieved_by_id_and_an_unknown_one_is_a_json_404(stack):
    c = client(stack)
    assert c.models.retrieve("tiny").model_dump() == c.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as missing:
        c.models.retrieve("gpt-4o")
    assert missing.value.body["code"] == "model_not_found" and "`tiny`" in missing.value.body["message"]


def test_chat_and_completions_answer_through_the_proxy(stack):
    c = client(stack)
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=12, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 12 or chat.choices[0].finish_reason == "stop"
    done = c.completions.create(model="tiny", prompt="import os\n", max_tokens=10, temperature=0)
    assert done.usage.completion_tokens >= 1
    assert isinstance(done.choices[0].text, str)


def test_streamed_chat_reassembles_to_the_non_streamed_text(stack):
    c = client(stack)
    messages = [{"role": "user", "content": "Write a haiku about caches."}]
    whole = c.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0)
    chunks = list(
        c.chat.completions.create(
            model="tiny", messages=messages, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_eight_concurrent_clients_at_width_2_all_succeed_without_worker_429s(stack):
    c = client(stack)

    def one(i: int) -> str:
        r = c.completions.create(model="tiny", prompt=f"# task {i}\ndef f{i}(", max_tokens=16, temperature=0)
        return r.choices[0].finish_reason

    with ThreadPoolExecutor(8) as pool:
        reasons = list(pool.map(one, range(8)))
    assert len(reasons) == 8  # any failure would have raised (max_retries=0)
    worker_metrics = get_text(stack.worker_url("w0") + "/metrics")
    assert not metric(worker_metrics, "mtpstack_worker_rejected_total", code="worker_full")
    proxy_metrics = get_text(stack.proxy_url + "/metrics")
    assert metric(proxy_metrics, "mtpstack_proxy_requests_total", model="tiny", status="200") >= 8


def test_requests_with_several_choices_take_as_many_slots_and_never_meet_a_worker_429(stack):
    c = client(stack)
    before = metric(get_text(stack.worker_url("w0") + "/metrics"), "mtpstack_worker_rejected_total", code="worker_full") or 0

    def one(i: int) -> int:
        # Long enough (~1 s and more) that a second request admitted beside a 2-choice one would
        # outwait the worker's 1 s admission grace: the proxy must count choices, not requests.
        r = c.completions.create(model="tiny", prompt=f"# task {i}\ndef f{i}(", max_tokens=300, temperature=0,
                                 n=2 if i % 2 == 0 else 1, extra_body={"ignore_eos": True})
        return len(r.choices)

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(4))) == [2, 1, 2, 1]
    after = metric(get_text(stack.worker_url("w0") + "/metrics"), "mtpstack_worker_rejected_total", code="worker_full") or 0
    assert after == before
    with pytest.raises(openai.BadRequestError, match=r"widest worker \(2\)"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=3)


def read_to_final_event_and_close(url, path: str, body: dict, finals: tuple[bytes, ...]) -> None:
    """A streamed request whose client closes the socket as soon as it holds a whole final event, as
    Codex, Claude Code and the SDKs do, while the worker may still have the stream's end to send."""
    data = json.dumps({"model": "tiny", "stream": True, "temperature": 0, **body}).encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(b"POST %b HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                  % (path.encode(), len(data), data))
        seen = b""
        while not any((i := seen.find(f)) >= 0 and b"\n\n" in seen[i:] for f in finals):
            chunk = s.recv(65536)
            assert chunk, f"the stream ended without a final event: {seen[-300:]!r}"
            seen += chunk


def test_clients_that_close_at_their_streams_final_event_are_counted_as_answered(stack):
    # Measured before the proxy knew final events: 1-20 of each 100 such requests counted as 499.
    cases = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, (b"data: [DONE]",)),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 4}, (b"event: response.completed", b"event: response.incomplete")),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, (b"event: message_stop",)),
    ]
    counts = lambda: {s: metric(get_text(stack.proxy_url + "/metrics"), "mtpstack_proxy_requests_total", model="tiny", status=s) or 0  # noqa: E731
                      for s in ("200", "499")}
    before = counts()
    url = urlsplit(stack.proxy_url)
    for path, body, finals in cases:
        for _ in range(20):
            read_to_final_event_and_close(url, path, body, finals)
    wait_until(lambda: counts()["200"] + counts()["499"] - before["200"] - before["499"] >= 60, 10, "the proxy to count 60 requests")
    after = counts()
    assert (after["200"] - before["200"], after["499"] - before["499"]) == (60, 0)


def test_a_client_that_disconnects_mid_stream_frees_its_slot(stack):
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}
    generated = lambda: metric(get_text(stack.worker_url("w0") + "/metrics"), "mtpstack_worker_tokens_generated_total") or 0  # noqa: E731
    before = generated()
    closed = lambda: metric(get_text(stack.proxy_url + "/metrics"), "mtpstack_proxy_requests_total", model="tiny", status="499") or 0  # noqa: E731
    closed_before = closed()  # the stack is shared by the module's tests: count only this one
    url = urlsplit(stack.proxy_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: ")
    conn.close()  # mid-stream: hundreds of tokens are still to come

    def freed():
        proxy = get_text(stack.proxy_url + "/metrics")
        worker = get_text(stack.worker_url("w0") + "/metrics")
        return metric(proxy, "mtpstack_proxy_inflight", worker="w0") == 0 and metric(worker, "mtpstack_worker_active_sequences") == 0

    wait_until(freed, 10, "the proxy and the worker to free the disconnected request's slot")
    # the worker stopped generating for the closed connection instead of finishing 400 tokens
    assert generated() - before < 400
    assert closed() - closed_before == 1


def test_the_proxy_restarted_while_workers_keep_running(stack):
    worker_pid = stack.worker_pid("w0")
    old_proxy = stack.state()["proxy"]["pid"]
    os.kill(old_proxy, signal.SIGKILL)
    wait_until(lambda: stack.state()["proxy"]["pid"] not in (None, old_proxy), 30, "`mtpstack up` to restart the proxy")
    wait_until(lambda: get_json(stack.proxy_url + "/readyz", timeout=2)[0] == 200, 60, "the new proxy to be ready")
    assert stack.worker_pid("w0") == worker_pid and alive(worker_pid)
    r = client(stack).completions.create(model="tiny", prompt="x = ", max_tokens=4, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_a_worker_killed_mid_stream_ends_the_stream_with_an_error_and_comes_back(stack):
    pid = stack.worker_pid("w0")
    stream = client(stack).completions.create(model="tiny", prompt="Once upon a time", max_tokens=400, temperature=0, stream=True)
    received = 0
    with pytest.raises(openai.APIError) as caught:
        for _ in stream:
            received += 1
            if received == 1:
                os.kill(pid, signal.SIGKILL)
    assert received >= 1
    assert "w0" in str(caught.value) or "worker" in str(caught.value)

    proxy = lambda: get_text(stack.proxy_url + "/metrics")  # noqa: E731
    wait_until(lambda: metric(proxy(), "mtpstack_proxy_inflight", worker="w0") == 0, 10, "the slot to be freed")
    wait_until(lambda: stack.worker_pid("w0") not in (None, pid), 30, "`mtpstack up` to restart the worker")
    wait_until(lambda: get_json(stack.proxy_url + "/readyz", timeout=2)[0] == 200, 90, "the restarted worker to be healthy")
    r = client(stack).completions.create(model="tiny", prompt="x = ", max_tokens=4, temperature=0)
    assert r.usage.completion_tokens >= 1
    assert stack.state()["workers"]["w0"]["restarts"] >= 1
