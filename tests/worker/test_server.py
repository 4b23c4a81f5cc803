"""A real `mtpstack worker` subprocess on loopback: API shape, width, admission, honesty."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import openai
import pytest

from mtpstack.worker.generation import STALL_FILE_ENV

CHAT = [{"role": "user", "content": "Write a haiku about the sea"}]
#: Generous bound for each HTTP exchange on a loaded 2-core machine.
TIMEOUT = aiohttp.ClientTimeout(total=60)


@pytest.fixture(scope="module")
def worker(tiny_pair, tmp_path_factory, live_worker_class):
    tmp = tmp_path_factory.mktemp("width3")
    stall = tmp / "stall"
    w = live_worker_class(
        tmp, *tiny_pair, depth=3, width=3,
        extra=["--admission-grace-seconds", "1", "--stall-seconds", "1"],
        env={STALL_FILE_ENV: str(stall)},
    )
    w.stall_file = stall
    with w:
        yield w


def test_models_lists_the_served_model_name(worker):
    body = worker.get_json("/v1/models")
    assert [m["id"] for m in body["data"]] == ["tiny"]


@pytest.mark.parametrize("path", ["/", "/api/hello"])
def test_a_clients_reachability_probe_is_answered(worker, path):
    """Claude Code's `HEAD /api/hello` (and `HEAD /`) against a worker it is pointed at directly: 200, not 404."""
    import urllib.request

    for method in ("HEAD", "GET"):
        with urllib.request.urlopen(urllib.request.Request(worker.url + path, method=method), timeout=30) as resp:
            assert resp.status == 200
            assert resp.read() == (b"" if method == "HEAD" else b'{"status": "ok"}')


def test_the_served_model_is_retrieved_by_id_and_another_is_a_json_404(worker, client):
    assert client.models.retrieve("tiny").model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("org/other-model")  # a hub id, slash included
    assert (missing.value.body["code"], missing.value.body["param"]) == ("model_not_found", "model")


def test_identity_names_what_was_loaded(worker, tiny_pair):
    from mtpstack.worker.proof import hash_weights

    ident = worker.get_json("/identity")
    assert ident["target"]["resolved_path"] == str(tiny_pair[0].resolve())
    assert ident["target"]["sha256"] == hash_weights(tiny_pair[0])
    assert ident["drafter"]["sha256"] == hash_weights(tiny_pair[1])
    assert (ident["draft_depth"], ident["max_num_seqs"], ident["pid"]) == (3, 3, worker.proc.pid)
    assert ident["device"] in ("cpu", "gpu") and ident["versions"]["mlx_lm"]


def test_streamed_chat_reassembles_to_the_non_streamed_text(client):
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=40, temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.usage.prompt_tokens > 0
    pieces, usage = [], None
    for chunk in client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=40, temperature=0, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == text
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_text_completions_stream_and_count_tokens(client):
    whole = client.completions.create(model="tiny", prompt="def main():", max_tokens=25, temperature=0)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="tiny", prompt="def main():", max_tokens=25, temperature=0, stream=True)
        if c.choices
    )
    assert streamed == whole.choices[0].text
    assert whole.usage.prompt_tokens == 7 or whole.usage.prompt_tokens > 0
    assert whole.choices[0].finish_reason in ("stop", "length")


def test_a_stop_string_ends_the_completion(client):
    full = client.completions.create(model="tiny", prompt="def main():", max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    stop = text[8:11]
    cut = client.completions.create(model="tiny", prompt="def main():", max_tokens=30, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"messages": CHAT, "n": 99}, 400, "unsupported_parameter"),  # beyond the batch width
        ({"messages": CHAT, "functions": [{"name": "f"}]}, 400, "unsupported_parameter"),
        ({"messages": CHAT, "top_logprobs": 3}, 400, "invalid_request"),
        ({"messages": [{"role": "user", "content": "x " * 600}]}, 400, "context_length_exceeded"),
        ({"messages": CHAT, "max_tokens": "ten"}, 400, "invalid_request"),
        ({"messages": []}, 400, "invalid_request"),
        ({"messages": CHAT, "model": "someone-else"}, 404, "model_not_found"),
        (b"{not json", 400, "invalid_request"),
    ],
)
def test_requests_it_cannot_honour_are_refused_with_a_code(worker, body, status, code):
    got, _, payload = worker.post_json("/v1/chat/completions", body)
    assert got == status
    assert payload["error"]["code"] == code
    assert payload["error"]["message"]


async def _active(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url + "/health") as r:
        return (await r.json())["active"]


async def _wait_active(session, url, n, timeout=20.0):
    async def poll():
        while await _active(session, url) != n:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


async def _open_stream(session, url, max_tokens=120):
    body = {"model": "tiny", "messages": CHAT, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    resp = await session.post(url + "/v1/chat/completions", json=body)
    assert resp.status == 200
    first = await asyncio.wait_for(resp.content.readline(), 20)  # the role chunk, written on admission
    assert first.startswith(b"data: ")
    return resp


async def test_three_sequences_progress_together_and_a_fourth_is_refused_after_the_grace(worker):
    url = worker.url
    log: list[tuple[int, str]] = []  # (stream, "token"|"done") in arrival order

    async def drain(i, resp):
        async for line in resp.content:
            if line.startswith(b"data: [DONE]"):
                log.append((i, "done"))
                break
            if line.startswith(b"data: "):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    log.append((i, "token"))
        resp.release()

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        worker.stall_file.touch()  # hold the loop so all three are admitted before any step
        try:
            streams = [await _open_stream(session, url) for _ in range(3)]
            await _wait_active(session, url, 3)
            async with session.post(url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 5}) as r:
                assert r.status == 429
                assert r.headers["Retry-After"]
                assert (await r.json())["error"]["code"] == "worker_full"
            # Work is pending and the loop makes no progress: the heartbeat says so.
            await asyncio.sleep(1.5)
            async with session.get(url + "/health") as r:
                assert r.status == 503
                assert (await r.json())["status"] == "stalled"
        finally:
            worker.stall_file.unlink(missing_ok=True)
        await asyncio.wait_for(asyncio.gather(*(drain(i, s) for i, s in enumerate(streams))), 60)
        first_token = {i: log.index((i, "token")) for i in range(3)}
        first_done = min(log.index((i, "done")) for i in range(3))
        assert max(first_token.values()) < first_done, log
        async with session.get(url + "/health") as r:
            assert r.status == 200
        metrics = await (await session.get(url + "/metrics")).text()
    assert 'mtpstack_worker_rejected_total{code="worker_full"}' in metrics
    assert "mtpstack_worker_accepted_by_position_total" in metrics


async def test_a_client_that_disconnects_frees_its_slot(worker):
    url = worker.url
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        worker.stall_file.touch()
        try:
            streams = [await _open_stream(session, url, max_tokens=200) for _ in range(3)]
            await _wait_active(session, url, 3)
            streams[0].close()  # the client goes away mid-generation
            await _wait_active(session, url, 2)
            # The freed slot admits a new request at once, while the other two still run.
            replacement = await _open_stream(session, url, max_tokens=5)
            await _wait_active(session, url, 3)
        finally:
            worker.stall_file.unlink(missing_ok=True)
        for resp in (*streams[1:], replacement):
            body = await asyncio.wait_for(resp.read(), 60)
            assert body.rstrip().endswith(b"data: [DONE]")
        await _wait_active(session, url, 0)


def _weights(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpstack", "weights", *args], capture_output=True, text=True, timeout=60)


def test_weights_proves_a_live_worker_by_pid_and_by_url(worker, tiny_pair):
    by_pid = _weights(str(worker.proc.pid))
    assert by_pid.returncode == 0, by_pid.stderr
    assert str(tiny_pair[0]) in by_pid.stdout and "agree" in by_pid.stdout
    by_url = _weights(worker.url, "--format", "json")
    assert by_url.returncode == 0, by_url.stderr
    report = json.loads(by_url.stdout)
    assert report["pid"] == worker.proc.pid and report["problems"] == []
    assert report["claim"]["drafter"] == str(tiny_pair[1]) and report["claim"]["depth"] == 3


def test_num_draft_tokens_lowers_the_depth_and_never_changes_greedy_text(worker):
    body = {"prompt": "def main():", "max_tokens": 30, "ignore_eos": True}
    _, _, deep = worker.post_json("/v1/completions", body)
    _, _, none = worker.post_json("/v1/completions", {**body, "num_draft_tokens": 0})
    _, _, more = worker.post_json("/v1/completions", {**body, "num_draft_tokens": 9})
    assert none["usage"]["draft_tokens"] == 0 and deep["usage"]["draft_tokens"] > 0
    assert deep["choices"][0]["text"] == none["choices"][0]["text"] == more["choices"][0]["text"]
    # 9 is capped at the worker's depth 3: each step drafts at most 3 of the 30 tokens' steps.
    assert more["usage"]["draft_tokens"] == deep["usage"]["draft_tokens"]


def test_a_longer_earlier_prompt_never_changes_a_later_answer(worker):
    # mlx_lm.server with a draft model and its prompt cache fails exactly this; the worker has no reuse.
    short = {"prompt": "import os\n", "max_tokens": 20, "ignore_eos": True}
    _, _, first = worker.post_json("/v1/completions", short)
    worker.post_json("/v1/completions", {**short, "prompt": "import os\nimport sys\n"})
    _, _, again = worker.post_json("/v1/completions", short)
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
async def test_asked_by_the_proxy_each_event_but_the_last_carries_the_tokens_so_far(worker, path):
    # `X-Mtpstack-Usage: 1` (the proxy's): a `: usage PROMPT CACHED COMPLETION` comment inside each event, rising,
    # ending at the stream's own usage; the final event as the API ends a stream; nothing without the header
    body = {"model": "tiny", "temperature": 0, "stream": True}
    body |= {"input": "def fib(n):", "max_output_tokens": 12} if path == "/v1/responses" else {"messages": CHAT, "max_tokens": 12}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(worker.url + path, json=body, headers={"X-Mtpstack-Usage": "1"}) as r:
            text = (await r.read()).decode()
        async with s.post(worker.url + path, json=body) as r:
            assert ": usage" not in (await r.read()).decode()
    events = [e for e in text.split("\n\n") if e]
    counts = [tuple(map(int, line.split()[2:])) for e in events for line in e.split("\n") if line.startswith(": usage ")]
    assert counts and ": usage" not in events[-1]
    assert all(e.split("\n")[-1].startswith(": usage ") for e in events[:-1] if not e.startswith(": keep-alive"))
    prompt = {p for p, _, _ in counts}
    assert len(prompt) == 1 and prompt.pop() > 0
    completions = [c for _, _, c in counts]
    assert completions == sorted(completions) and 0 < completions[-1] <= 12
