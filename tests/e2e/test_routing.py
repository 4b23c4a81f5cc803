"""Cache-aware routing on real workers (tiny models, width 1 each) behind the proxy, driven by the
official openai client: a conversation returns to the worker that served it, a shared key never
serializes requests, and a restarted worker loses what it was remembered for."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket

import pytest
from aiohttp.test_utils import TestServer

from mtpstack.proxy import STATE
from mtpstack.proxy.app import create_app
from mtpstack.proxy.fleet import FLEET
from mtpstack.validator import FleetConfig
from tests.e2e.conftest import fleet, running_workers

#: Tokens of each of two streams that must overlap: long enough to run side by side on any machine,
#: within the tiny target's 512-token context.
STREAM_TOKENS = 200
SYSTEM = "You are a coding agent with the tools read_file, write_file and run_tests."


@pytest.fixture(scope="module")
def workers(tiny_pair, tmp_path_factory):
    with running_workers(fleet(*tiny_pair, width=1, workers=2), tmp_path_factory.mktemp("routing")) as w:
        yield w


@pytest.fixture(scope="module")
def wide_workers(tiny_pair, tmp_path_factory):
    """Two workers of width 2: a worker serving one request still has a free slot."""
    with running_workers(fleet(*tiny_pair, width=2, workers=2), tmp_path_factory.mktemp("routing-wide")) as w:
        yield w


@contextlib.asynccontextmanager
async def serving(workers, routing: str = "affinity"):
    data = {**workers.data, "proxy": {**workers.data["proxy"], "routing": routing}}
    server = TestServer(create_app(FleetConfig.model_validate(data), health_interval=0.1, fleet_interval=0.1))
    await server.start_server()
    state = server.app[STATE]
    try:
        await wait_for(lambda: all(u.healthy for u in state.upstreams.values()), "both workers healthy at the proxy")
        yield server
    finally:
        await server.close()


@pytest.fixture
async def proxy(workers, request):
    async with serving(workers, getattr(request, "param", "affinity")) as server:
        yield server


async def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if value := predicate():
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def client(server):
    import openai

    return openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="none", max_retries=0)


def conversation(turn: int, tag: str) -> list[dict]:
    """Turn `turn` (1-based): the system prompt, the first question, then each answer and a follow-up."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {tag}: add a test"}]
    for i in range(1, turn):
        messages += [{"role": "assistant", "content": f"done {tag}{i}"}, {"role": "user", "content": f"next {tag}{i}"}]
    return messages


def served(caplog, rid: str) -> tuple[str, str]:
    """(worker, routing decision) of the request the proxy logged under `rid`."""
    for record in caplog.records:
        if record.name == "mtpstack.proxy" and rid in record.getMessage():
            line = json.loads(record.getMessage())
            if line.get("event") == "request" and line["request_id"] == rid:
                return line["worker"], line["routing"]
    raise AssertionError(f"no request line for {rid}")


async def turn(server, n: int, tag: str, rid: str, **extra) -> None:
    reply = await client(server).chat.completions.create(
        model="tiny", messages=conversation(n, tag), max_tokens=8, temperature=0, extra_headers={"X-Request-Id": rid}, **extra)
    assert reply.choices[0].message.role == "assistant"


class FirstWorkerHeld:
    """The first worker's one slot taken in the proxy's own admission, as an unrelated long request
    holds it. (A real request cannot hold it reliably: the tiny target's 512-token context lets it
    run for well under a second, which a busy machine can spend before the next request arrives.)"""

    def __init__(self, server):
        self.admission = server.app[STATE].admissions["tiny"]

    async def __aenter__(self):
        self.upstream = await self.admission.acquire()
        assert self.upstream.name == "w0" and self.upstream.inflight == self.upstream.gate
        return self

    async def __aexit__(self, *exc):
        self.admission.release(self.upstream)


async def first_turn_on_the_second_worker(server, caplog, tag: str, **extra) -> None:
    async with FirstWorkerHeld(server):
        await turn(server, 1, tag, f"{tag}-1", **extra)
    assert served(caplog, f"{tag}-1") == ("w1", "new")
    state = server.app[STATE]
    assert state.upstreams["w0"].inflight == 0 and state.upstreams["w1"].inflight == 0


@pytest.mark.parametrize("extra", [{}, {"prompt_cache_key": "conv-key"}], ids=["without-a-key", "with-a-key"])
async def test_a_conversation_whose_first_turn_went_to_the_second_worker_stays_there(proxy, caplog, extra):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    tag = "k" if extra else "p"
    await first_turn_on_the_second_worker(proxy, caplog, tag, **extra)
    for n in (2, 3, 4):
        await turn(proxy, n, tag, f"{tag}-{n}", **extra)
        assert served(caplog, f"{tag}-{n}") == ("w1", "affinity")


@pytest.mark.parametrize("proxy", ["first-free"], indirect=True)
async def test_under_first_free_the_next_turn_goes_to_the_first_worker_where_nothing_of_it_is(proxy, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    async with FirstWorkerHeld(proxy):
        await turn(proxy, 1, "f", "f-1", prompt_cache_key="conv-f")
    assert served(caplog, "f-1") == ("w1", "first_free")
    await turn(proxy, 2, "f", "f-2", prompt_cache_key="conv-f")
    assert served(caplog, "f-2") == ("w0", "first_free")  # the failure issue 21 fixes


async def test_two_requests_with_one_key_run_on_two_free_workers_at_once(proxy, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    state = proxy.app[STATE]
    both_busy = []

    async def sample():
        while True:
            both_busy.append(all(u.inflight == 1 for u in state.upstreams.values()))
            await asyncio.sleep(0)

    async def one(rid: str) -> None:
        stream = await client(proxy).completions.create(
            model="tiny", prompt="def fib(n):", max_tokens=STREAM_TOKENS, extra_body={"ignore_eos": True, "prompt_cache_key": "one-key"},
            temperature=0, stream=True, extra_headers={"X-Request-Id": rid})
        async for _ in stream:
            pass

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(one("same-1"), one("same-2"))
    finally:
        sampler.cancel()
    workers = {served(caplog, "same-1")[0], served(caplog, "same-2")[0]}
    assert workers == {"w0", "w1"}
    assert any(both_busy)  # side by side, neither waited for the other
    decisions = sorted(served(caplog, rid)[1] for rid in ("same-1", "same-2"))
    assert decisions == ["fallback_busy", "new"]  # the second found the first's worker full: no wait


async def test_a_restarted_worker_loses_its_affinities(proxy, workers, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    await first_turn_on_the_second_worker(proxy, caplog, "r", prompt_cache_key="conv-r")
    state = proxy.app[STATE]
    old = workers.procs["w1"]
    old.kill()
    # In threads: the proxy in this event loop keeps checking its workers meanwhile, as it would.
    await asyncio.to_thread(old.wait, 10)
    await asyncio.to_thread(workers.start, "w1")
    await asyncio.to_thread(workers.wait_healthy)
    new_pid = workers.procs["w1"].pid
    assert new_pid != old.pid
    collector = proxy.app[FLEET]
    await wait_for(lambda: state.upstreams["w1"].healthy and collector.tracks["w1"].pid == new_pid,
                   "the restarted worker healthy at the proxy, its new pid seen", timeout=60)
    await turn(proxy, 2, "r", "r-2", prompt_cache_key="conv-r")
    # Nothing of the conversation is cached anywhere now: it is new, and both being free, goes to w0.
    assert served(caplog, "r-2") == ("w0", "new")


#: A file's first 540 characters, as a code-completion client sends it, then each request its own end.
BEGINNING = ('"""Helpers shared by the parser and the scheduler: paths, retries and small text utilities."""\n\n'
             "from __future__ import annotations\n\nimport os\nimport sys\nimport time\nfrom pathlib import Path\n\n"
             "RETRIES = 3\nBACKOFF_SECONDS = 0.5\n\n\ndef read_text(path: Path) -> str:\n"
             '    """The file at `path` as text, retried a few times when it is being written."""\n'
             "    for attempt in range(RETRIES):\n        try:\n            return path.read_text()\n"
             "        except OSError:\n            time.sleep(BACKOFF_SECONDS * (attempt + 1))\n"
             "    return path.read_text()\n\n\ndef ")


async def complete(server, prompt: str, rid: str) -> None:
    reply = await client(server).completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                                    extra_headers={"X-Request-Id": rid})
    assert reply.choices[0].text is not None


async def test_completion_prompts_that_share_a_beginning_go_to_the_worker_holding_it(proxy, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    assert 450 <= len(BEGINNING) <= 600  # about 500 characters, the case issue 39 names
    async with FirstWorkerHeld(proxy):
        await complete(proxy, BEGINNING + "split_lines(text: str) -> list[str]:\n", "b-1")
    assert served(caplog, "b-1") == ("w1", "new")
    for n, end in enumerate(["join_paths(*parts: str) -> str:\n", "env_flag(name: str) -> bool:\n", "main() -> int:\n"], 2):
        await complete(proxy, BEGINNING + end, f"b-{n}")
        assert served(caplog, f"b-{n}") == ("w1", "affinity")  # without a key: by the beginning it shares


async def test_token_id_prompts_that_share_a_beginning_go_to_the_worker_holding_it(proxy, caplog):
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    beginning = [(7 * i) % 200 + 3 for i in range(60)]  # 480 bytes packed: past the first boundary
    async with FirstWorkerHeld(proxy):
        reply = await client(proxy).completions.create(model="tiny", prompt=[*beginning, 11, 12], max_tokens=4, temperature=0,
                                                       extra_headers={"X-Request-Id": "i-1"})
    assert served(caplog, "i-1") == ("w1", "new") and reply.choices
    await client(proxy).completions.create(model="tiny", prompt=[*beginning, 40, 41, 42], max_tokens=4, temperature=0,
                                           extra_headers={"X-Request-Id": "i-2"})
    assert served(caplog, "i-2") == ("w1", "affinity")


def sent_together(server, requests: list[tuple[str, dict]]) -> list[socket.socket]:
    """Each chat request written whole on its own connection before the proxy's event loop (this
    test's) runs again, so the proxy routes them all before any worker can have answered one: what
    agents starting together look like to it, without a race. (Raw HTTP: a client library would
    let the loop run between the two.)"""
    socks = []
    for rid, body in requests:
        data = json.dumps(body).encode()
        sock = socket.create_connection((server.host, server.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                     b"X-Request-Id: %b\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%b" % (rid.encode(), len(data), data))
        socks.append(sock)
    return socks


async def answer_status(sock: socket.socket) -> int:
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        answer = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1])


async def test_new_conversations_sharing_a_system_prompt_start_on_both_idle_workers(wide_workers, caplog):
    """Two agents start at once with one system prompt: each worker has room for both, but neither
    holds the prompt yet, so they go one to each (before, the second followed the first to the
    worker still prefilling it, and the other idled)."""
    caplog.set_level(logging.INFO, logger="mtpstack.proxy")
    async with serving(wide_workers) as server:
        bodies = [(f"s-{tag}", {"model": "tiny", "messages": conversation(1, tag), "max_tokens": 8, "temperature": 0}) for tag in "ab"]
        statuses = await asyncio.gather(*map(answer_status, sent_together(server, bodies)))
        assert statuses == [200, 200]
        assert sorted(served(caplog, rid) for rid in ("s-a", "s-b")) == [("w0", "new"), ("w1", "new")]
        # Once answered, both hold it: a third conversation follows it to one of them, by affinity.
        await turn(server, 1, "c", "s-c")
        assert served(caplog, "s-c")[1] == "affinity"
