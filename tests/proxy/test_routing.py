"""Cache-aware routing: what identifies a conversation, the bounded memory of where it went, and the
proxy sending a conversation back to its worker over HTTP (real aiohttp upstreams on loopback that
count their own concurrency), never at the cost of the gate or of waiting."""

from __future__ import annotations

import asyncio
import random
import typing

import pytest

from mtpstack.proxy.routing import (
    AFFINITY_ENTRIES,
    DECISIONS,
    LOOKUP_BOUNDARIES,
    MAX_TEXT_BYTES,
    MAX_UNITS,
    TEXT_BEGINNING_BYTES,
    TEXT_BLOCK_BYTES,
    Affinity,
    affinity_keys,
    hit_rate,
)
from mtpstack.validator import ProxyConfig
from tests.proxy.test_fleet import identity_of, wait_for
from tests.proxy.test_proxy import eventually

CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You are a coding agent. Tools: read_file, write_file, run_tests. " * 40}


def turns(n: int, tag: str = "a") -> list[dict]:
    """The messages of a conversation's turn n (1-based): each answer appended, then the next question."""
    messages = [SYSTEM, {"role": "user", "content": f"task {tag}: fix the failing test"}]
    for i in range(1, n):
        messages += [{"role": "assistant", "content": f"answer {tag}{i}"}, {"role": "user", "content": f"and then {tag}{i}"}]
    return messages


def recorded_then_found(first: dict, second: dict, path: str = CHAT) -> bool:
    table = Affinity()
    table.remember(affinity_keys(path, first).record, "w1")
    return table.preferred(affinity_keys(path, second).lookup) == "w1"


# -- what identifies a conversation ---------------------------------------------------------
def test_the_policies_are_the_config_models():
    assert set(DECISIONS) == set(typing.get_args(ProxyConfig.model_fields["routing"].annotation))


def test_a_next_turn_finds_the_previous_turns_worker_without_any_key():
    assert recorded_then_found({"messages": turns(1)}, {"messages": turns(2)})
    assert recorded_then_found({"messages": turns(3)}, {"messages": turns(4)})


def test_conversations_that_share_only_a_system_prompt_are_told_apart():
    table = Affinity()
    table.remember(affinity_keys(CHAT, {"messages": turns(1, "a")}).record, "w0")
    table.remember(affinity_keys(CHAT, {"messages": turns(1, "b")}).record, "w1")
    assert table.preferred(affinity_keys(CHAT, {"messages": turns(2, "a")}).lookup) == "w0"
    assert table.preferred(affinity_keys(CHAT, {"messages": turns(2, "b")}).lookup) == "w1"
    # A new conversation with the same system prompt goes where that prompt was last served.
    assert table.preferred(affinity_keys(CHAT, {"messages": turns(1, "c")}).lookup) == "w1"


def test_a_key_decides_over_the_prompt_and_user_over_nothing():
    assert recorded_then_found({"prompt_cache_key": "k", "messages": turns(1, "a")}, {"prompt_cache_key": "k", "messages": turns(1, "b")})
    assert not recorded_then_found({"prompt_cache_key": "k", "messages": turns(1)}, {"prompt_cache_key": "other", "messages": turns(2)})
    assert recorded_then_found({"user": "u1", "messages": turns(1, "a")}, {"user": "u1", "messages": turns(1, "b")})


def test_a_completion_prompt_that_grows_finds_its_worker():
    text = "def fib(n):\n    " * 200
    assert recorded_then_found({"prompt": text}, {"prompt": text + "return n if n < 2 else fib(n - 1) + fib(n - 2)\n"}, "/v1/completions")
    assert recorded_then_found({"prompt": "short"}, {"prompt": "short, then longer"}, "/v1/completions") is False


def test_the_responses_api_is_keyed_by_instructions_and_input():
    first = {"instructions": "be brief " * 50, "input": [{"role": "user", "content": "q1"}]}
    second = {**first, "input": [*first["input"], {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]}
    assert recorded_then_found(first, second, "/v1/responses")
    assert not recorded_then_found(first, {**second, "instructions": "other"}, "/v1/responses")


MESSAGES = "/v1/messages"


def claude_code_turn(session: str, n: int, tag: str = "a") -> dict:
    """Claude Code's request for turn n: its system blocks, its context as a message of role `system`
    (blocks on the first turn, a string after), the `cache_control` mark on the newest message."""
    context = {"role": "system", "content": [{"type": "text", "text": "<context>cwd</context>", "cache_control": {"type": "ephemeral"}}]}
    messages = [{"role": "user", "content": [{"type": "text", "text": f"task {tag}"}]}, context]
    for i in range(1, n):
        messages[1] = {"role": "system", "content": "<context>cwd</context>"}
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": "ls"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"out {tag}{i}"}]}]
    for m in messages[2:]:
        for b in m["content"]:
            b.pop("cache_control", None)
    if isinstance(messages[-1]["content"], list):
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    user_id = f'{{"device_id": "d", "session_id": "{session}"}}' if session else None
    return {"system": [{"type": "text", "text": "You are Claude Code. " * 40, "cache_control": {"type": "ephemeral"}}],
            "messages": messages, **({"metadata": {"user_id": user_id}} if user_id else {})}


def test_claude_codes_session_id_keys_its_conversation():
    assert recorded_then_found(claude_code_turn("s-1", 1, "a"), claude_code_turn("s-1", 1, "b"), MESSAGES)
    assert not recorded_then_found(claude_code_turn("s-1", 1), claude_code_turn("s-2", 2), MESSAGES)
    plain = {"messages": [{"role": "user", "content": "q"}], "metadata": {"user_id": "user-7"}}
    assert recorded_then_found(plain, {**plain, "messages": [{"role": "user", "content": "other"}]}, MESSAGES)


def test_a_messages_conversation_without_a_session_finds_its_worker_though_its_cache_marks_moved():
    assert recorded_then_found(claude_code_turn("", 1), claude_code_turn("", 2), MESSAGES)
    assert recorded_then_found(claude_code_turn("", 2), claude_code_turn("", 3), MESSAGES)


@pytest.mark.parametrize(
    "payload",
    [{}, {"messages": "x"}, {"messages": [None, 3, {"a": float("nan")}]}, {"prompt": 5}, {"prompt_cache_key": 3, "user": ["x"]},
     {"prompt": [1, 2, 3]}, {"input": {"x": 1}}, {"messages": [{"content": "\ud800"}]},
     {"metadata": {"user_id": "{" + "[" * 5000}}, {"metadata": {"user_id": '{"session_id": 5}'}}, {"metadata": "x"},
     {"system": [None, {"type": "text"}], "messages": [{"content": [None, 1]}]}, {"metadata": {"user_id": "[" * 4000}}],
)
def test_odd_bodies_give_keys_or_none_and_never_raise(payload):
    for path in (CHAT, "/v1/completions", "/v1/responses", MESSAGES):
        keys = affinity_keys(path, payload)
        assert len(keys.lookup) <= LOOKUP_BOUNDARIES + 1 and len(keys.record) <= 3


def test_conversations_that_share_a_system_prompt_of_100_kb_are_still_told_apart():
    system = {"role": "system", "content": "tool: read a file and return its lines. " * 2500}  # 100 KB
    a = [system, {"role": "user", "content": "task a"}]
    b = [system, {"role": "user", "content": "task b"}]
    table = Affinity()
    table.remember(affinity_keys(CHAT, {"messages": a}).record, "w0")
    table.remember(affinity_keys(CHAT, {"messages": b}).record, "w1")
    assert table.preferred(affinity_keys(CHAT, {"messages": [*a, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]}).lookup) == "w0"
    assert table.preferred(affinity_keys(CHAT, {"messages": [*b, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]}).lookup) == "w1"


def test_a_long_completion_prompt_is_hashed_to_its_end_in_blocks_up_to_the_bound():
    text = "def f(x):\n    return x\n" * 20_000  # 480 KB
    keys = affinity_keys("/v1/completions", {"prompt": text})
    assert len(keys.record) == 3
    assert recorded_then_found({"prompt": text}, {"prompt": text + "y = f(1)\n"}, "/v1/completions")
    assert not recorded_then_found({"prompt": text}, {"prompt": "#" + text}, "/v1/completions")
    # Past `MAX_UNITS` blocks the rest is not read: two prompts alike that far are one prefix.
    bound = MAX_UNITS * TEXT_BLOCK_BYTES
    assert recorded_then_found({"prompt": "x" * bound + "a"}, {"prompt": "x" * bound + "b"}, "/v1/completions")


def test_completion_prompts_that_share_only_a_beginning_find_the_worker_holding_it():
    beginning = "# one file's first lines, the same in every request\n" * 10  # 530 bytes
    assert recorded_then_found({"prompt": beginning + "def a():"}, {"prompt": beginning + "class B:"}, "/v1/completions")
    ids = list(range(40))  # 320 bytes packed
    assert recorded_then_found({"prompt": [*ids, 1]}, {"prompt": [*ids, 2, 3]}, "/v1/completions")
    # A shared beginning shorter than the first boundary is no shared prefix.
    short = "x" * (TEXT_BEGINNING_BYTES - 1)
    assert not recorded_then_found({"prompt": short + "a" * 300}, {"prompt": short + "b" * 300}, "/v1/completions")
    # A Responses input string is keyed the same way, after its instructions.
    first = {"instructions": "be brief", "input": beginning + "first"}
    assert recorded_then_found(first, {**first, "input": beginning + "second"}, "/v1/responses")
    assert not recorded_then_found(first, {"instructions": "be long", "input": beginning + "second"}, "/v1/responses")


def test_a_megabyte_of_prompt_text_or_token_ids_costs_a_bounded_number_of_keys():
    for payload in ({"prompt": "é" * MAX_TEXT_BYTES}, {"prompt": list(range(MAX_TEXT_BYTES))}, {"prompt": "x" * (3 * MAX_TEXT_BYTES)}):
        keys = affinity_keys("/v1/completions", payload)
        assert len(keys.record) == 3 and len(keys.lookup) == LOOKUP_BOUNDARIES + 1


def test_a_token_id_prompt_that_grows_finds_its_worker():
    ids = list(range(5000))
    assert recorded_then_found({"prompt": ids}, {"prompt": [*ids, 7, 8, 9]}, "/v1/completions")
    assert not recorded_then_found({"prompt": ids}, {"prompt": [1, *ids]}, "/v1/completions")
    assert recorded_then_found({"prompt": [[1, 2], [3]]}, {"prompt": [[1, 2], [3]]}, "/v1/completions")  # a batch: as JSON


def test_messages_past_the_bound_are_never_rendered():
    class NeverRendered:
        def __repr__(self):
            raise AssertionError("a message past the bound was rendered")

    many = [{"role": "user", "content": "x"}] * MAX_UNITS
    keys = affinity_keys(CHAT, {"messages": [*many, *[NeverRendered()] * 100_000]})
    assert len(keys.lookup) == LOOKUP_BOUNDARIES + 1


# -- the memory ---------------------------------------------------------------------------
def test_the_memory_is_bounded_and_forgets_the_least_recently_used():
    table = Affinity(capacity=3)
    for k in (b"a", b"b", b"c"):
        table.remember([k], "w0")
    assert table.preferred([b"a"]) == "w0"  # used: now the most recent
    table.remember([b"d"], "w1")
    assert len(table) == 3
    assert table.preferred([b"b"]) is None and table.preferred([b"a"]) == "w0"
    assert AFFINITY_ENTRIES >= 10_000


def test_forgetting_a_worker_drops_its_entries_and_only_its():
    table = Affinity()
    table.remember([b"a"], "w0")
    table.remember([b"b"], "w1")
    table.forget("w0")
    assert (table.preferred([b"a"]), table.preferred([b"b"])) == (None, "w1")
    table.remember([b"a"], "w0")  # served again after the restart: remembered again
    assert table.preferred([b"a"]) == "w0"


def test_the_hit_rate_counts_only_requests_that_had_a_worker_remembered():
    assert hit_rate({"affinity": 3, "fallback_busy": 1, "new": 10}) == 0.75
    assert hit_rate({"new": 4}) is None


# -- over HTTP ------------------------------------------------------------------------------
def chat(messages, tag, **extra) -> dict:
    return {"model": "m", "messages": messages, "x_fake": {"tag": tag, **extra.pop("fake", {})}, **extra}


def served_by(f, tag) -> str:
    (name,) = [n for n, fake in f.fakes.items() if tag in fake.arrivals]
    return name


def routing(f) -> dict[str, int]:
    return f.state.metrics.routing_counts("m")


async def first_turn_on_the_second_worker(f, **extra):
    """Turn 1 of a conversation while an unrelated long request holds w0; then w0 is free again."""
    hold = asyncio.create_task(f.client.post(CHAT, json=chat([{"role": "user", "content": "long"}], "hold", fake={"hold": "long"})))
    await eventually(lambda: f.state.upstreams["w0"].inflight == 1, what="the long request on w0")
    r = await f.client.post(CHAT, json=chat(turns(1), "t1", **extra))
    f.fakes["w0"].release("long")
    assert r.status == 200 and served_by(f, "t1") == "w1"
    assert (await hold).status == 200
    await eventually(lambda: f.state.upstreams["w0"].inflight == 0, what="w0 free")


@pytest.mark.parametrize("extra", [{}, {"prompt_cache_key": "conv-1"}, {"user": "alice"}])
async def test_a_conversation_that_went_to_the_second_worker_stays_there_once_both_are_free(make_fleet, extra):
    f = await make_fleet({"w0": {"gate": 1}, "w1": {"gate": 1}})
    await first_turn_on_the_second_worker(f, **extra)
    for n in (2, 3, 4):
        r = await f.client.post(CHAT, json=chat(turns(n), f"t{n}", **extra))
        assert r.status == 200 and served_by(f, f"t{n}") == "w1"
    assert routing(f) == {"new": 2, "affinity": 3, "fallback_busy": 0}
    f.assert_no_violations()


async def test_under_first_free_the_next_turns_go_to_the_least_loaded_worker_as_before(make_fleet):
    f = await make_fleet({"w0": {"gate": 1}, "w1": {"gate": 1}}, proxy={"routing": "first-free"})
    await first_turn_on_the_second_worker(f, prompt_cache_key="conv-1")
    r = await f.client.post(CHAT, json=chat(turns(2), "t2", prompt_cache_key="conv-1"))
    assert r.status == 200 and served_by(f, "t2") == "w0"
    assert routing(f) == {"first_free": 3}
    assert "routing_total" in (await (await f.client.get("/metrics")).text())


async def test_with_an_affinity_wait_a_next_turn_waits_for_its_full_worker_instead_of_moving(make_fleet):
    f = await make_fleet({"w0": {"gate": 1}, "w1": {"gate": 1}}, proxy={"affinityWaitSeconds": 5})
    await first_turn_on_the_second_worker(f, prompt_cache_key="conv-1")
    # Turn 2 holds w1 a while; turn 3 of the same conversation waits for it though w0 is free.
    two = asyncio.create_task(f.client.post(CHAT, json=chat(turns(2), "t2", prompt_cache_key="conv-1", fake={"hold": "t2"})))
    await eventually(lambda: f.state.upstreams["w1"].inflight == 1, what="turn 2 on w1")
    three = asyncio.create_task(f.client.post(CHAT, json=chat(turns(3), "t3", prompt_cache_key="conv-1")))
    await eventually(lambda: f.state.admissions["m"].waiting == 1, what="turn 3 waiting for w1")
    f.fakes["w1"].release("t2")
    r = await three
    assert r.status == 200 and (await two).status == 200
    assert (served_by(f, "t2"), served_by(f, "t3")) == ("w1", "w1")
    assert routing(f) == {"new": 2, "affinity": 2, "fallback_busy": 0}
    assert f.state.admissions["m"].prefer_wait_seconds == 5
    f.assert_no_violations()


async def test_the_affinity_wait_is_off_under_first_free(make_fleet):
    f = await make_fleet({"w0": {"gate": 1}}, proxy={"routing": "first-free", "affinityWaitSeconds": 5})
    assert f.state.admissions["m"].prefer_wait_seconds == 0


async def test_two_requests_with_one_key_run_on_two_free_workers_at_once(make_fleet):
    f = await make_fleet({"w0": {"gate": 1}, "w1": {"gate": 1}})
    body = lambda tag: chat(turns(1), tag, prompt_cache_key="shared", fake={"hold": "both"})  # noqa: E731
    both = [asyncio.create_task(f.client.post(CHAT, json=body(tag))) for tag in "xy"]
    await eventually(lambda: f.fakes["w0"].active == f.fakes["w1"].active == 1, what="one on each worker")
    f.fakes["w0"].release("both")
    f.fakes["w1"].release("both")
    r1, r2 = await asyncio.gather(*both)
    assert (r1.status, r2.status) == (200, 200)
    assert {served_by(f, "x"), served_by(f, "y")} == {"w0", "w1"}
    assert routing(f) == {"new": 1, "fallback_busy": 1, "affinity": 0}
    assert max(f.fakes["w0"].max_active, f.fakes["w1"].max_active) == 1  # each ran one, side by side
    f.assert_no_violations()


async def test_the_affinity_moves_with_a_request_that_found_its_worker_full(make_fleet):
    f = await make_fleet({"w0": {"gate": 1}, "w1": {"gate": 1}})
    key = {"prompt_cache_key": "c"}
    assert (await f.client.post(CHAT, json=chat(turns(1), "t1", **key))).status == 200
    assert served_by(f, "t1") == "w0"
    hold = asyncio.create_task(f.client.post(CHAT, json=chat(turns(1, "z"), "hold", fake={"hold": "z"})))
    await eventually(lambda: f.state.upstreams["w0"].inflight == 1, what="w0 busy")
    assert (await f.client.post(CHAT, json=chat(turns(2), "t2", **key))).status == 200
    assert served_by(f, "t2") == "w1"
    f.fakes["w0"].release("z")
    await hold
    await eventually(lambda: f.state.upstreams["w0"].inflight == 0, what="w0 free")
    assert (await f.client.post(CHAT, json=chat(turns(3), "t3", **key))).status == 200
    assert served_by(f, "t3") == "w1"


async def test_new_conversations_sharing_a_system_prompt_spread_until_a_worker_holds_it(make_fleet):
    """A worker holds a prompt once its answer begins: a second conversation with the same system
    prompt, sent while the first is still being prefilled, goes to the idle worker; a third, sent
    once the first's stream has begun, follows it there."""
    f = await make_fleet({"w0": {"gate": 2}, "w1": {"gate": 2}})
    prefilling = chat(turns(1, "a"), "a", stream=True, fake={"hold_first": "a", "chunks": 4, "interval": 0.1})
    first = await f.client.post(CHAT, json=prefilling)  # its head is out; its first token is not
    assert served_by(f, "a") == "w0"
    second = asyncio.create_task(f.client.post(CHAT, json=chat(turns(1, "b"), "b", fake={"hold": "b"})))
    await eventually(lambda: "b" in f.fakes["w1"].arrivals or "b" in f.fakes["w0"].arrivals, what="the second conversation sent")
    assert served_by(f, "b") == "w1"
    f.fakes["w0"].release("a")
    assert await first.content.readany()  # the first token: w0 holds the system prompt now
    r = await f.client.post(CHAT, json=chat(turns(1, "c"), "c"))
    assert r.status == 200 and served_by(f, "c") == "w0"
    await first.read()
    f.fakes["w1"].release("b")
    assert (await second).status == 200
    assert routing(f) == {"new": 2, "affinity": 1, "fallback_busy": 0}
    f.assert_no_violations()


async def test_a_plain_answer_makes_its_shared_beginning_followed_once_it_is_whole(make_fleet):
    f = await make_fleet({"w0": {"gate": 2}, "w1": {"gate": 2}})
    slow = asyncio.create_task(f.client.post(CHAT, json=chat(turns(1, "a"), "a", fake={"hold": "a"})))
    await eventually(lambda: f.state.upstreams["w0"].inflight == 1, what="the first conversation on w0")
    assert (await f.client.post(CHAT, json=chat(turns(1, "b"), "b"))).status == 200
    assert served_by(f, "b") == "w1"  # w0 had a free slot, but nothing of the prompt yet
    f.fakes["w0"].release("a")
    assert (await slow).status == 200
    assert (await f.client.post(CHAT, json=chat(turns(1, "c"), "c"))).status == 200
    assert served_by(f, "c") == "w0"  # where the system prompt was last served whole


async def test_a_refused_request_leaves_its_shared_beginning_where_it_was(make_fleet):
    f = await make_fleet({"w0": {"gate": 1}, "w1": {"gate": 1}})
    assert (await f.client.post(CHAT, json=chat(turns(1, "a"), "a"))).status == 200
    hold = asyncio.create_task(f.client.post(CHAT, json=chat([{"role": "user", "content": "long"}], "hold", fake={"hold": "long"})))
    await eventually(lambda: f.state.upstreams["w0"].inflight == 1, what="w0 busy")
    refused = await f.client.post(CHAT, json=chat(turns(1, "b"), "b", fake={"status": 400, "code": "bad"}))
    f.fakes["w0"].release("long")
    assert refused.status == 400 and served_by(f, "b") == "w1"
    await hold
    assert (await f.client.post(CHAT, json=chat(turns(1, "c"), "c"))).status == 200
    assert served_by(f, "c") == "w0"


async def test_a_worker_that_goes_unhealthy_loses_its_conversations(make_fleet):
    f = await make_fleet({"w0": {"gate": 1}, "w1": {"gate": 1}})
    await first_turn_on_the_second_worker(f, prompt_cache_key="c")
    f.fakes["w1"].health_status = 503
    await eventually(lambda: not f.state.upstreams["w1"].healthy, what="w1 unhealthy")
    f.fakes["w1"].health_status = 200
    await eventually(lambda: f.state.upstreams["w1"].healthy, what="w1 back")
    assert (await f.client.post(CHAT, json=chat(turns(2), "t2", prompt_cache_key="c"))).status == 200
    assert served_by(f, "t2") == "w0"  # nothing remembered: the least loaded, in config order
    assert routing(f)["new"] == 3


async def test_a_worker_that_restarts_between_two_health_checks_loses_its_conversations(make_fleet):
    f = await make_fleet({"w0": {"gate": 1, "identity": identity_of(1, pid=10)}, "w1": {"gate": 1, "identity": identity_of(1, pid=11)}})
    await wait_for(lambda: f.collector.tracks["w1"].pid == 11, "the first identity")
    await first_turn_on_the_second_worker(f, prompt_cache_key="c")
    rounds = f.collector.rounds
    f.fakes["w1"].identity = identity_of(1, pid=12)  # healthy throughout: only its pid tells
    await wait_for(lambda: f.collector.rounds > rounds + 1 and f.collector.tracks["w1"].pid == 12, "the new pid")
    assert f.state.upstreams["w1"].healthy
    assert (await f.client.post(CHAT, json=chat(turns(2), "t2", prompt_cache_key="c"))).status == 200
    assert served_by(f, "t2") == "w0"


async def test_the_gate_holds_and_every_request_is_answered_under_1000_mixed_requests(make_fleet):
    """Keys, users, shared and distinct prompts on all three endpoints, streams and plain answers,
    some clients leaving early, through three workers of gate 2."""
    f = await make_fleet(
        {"w0": {"gate": 2}, "w1": {"gate": 2}, "w2": {"gate": 2}}, proxy={"queue": {"maxWaiting": 1000, "timeoutSeconds": 60}},
    )
    rng = random.Random(21)
    ups = f.state.upstreams.values()
    peak = {u.name: 0 for u in ups}
    sampling = True

    async def sample():
        while sampling:
            for u in ups:
                assert u.inflight <= u.gate, f"{u.name}: {u.inflight} in flight above its gate of {u.gate}"
                peak[u.name] = max(peak[u.name], u.inflight)
            await asyncio.sleep(0)

    def body(i: int) -> tuple[str, dict]:
        kind = rng.randrange(6)
        fake = {"tag": i, "delay": rng.choice([0, 0, 0.002, 0.01]), "chunks": rng.randint(1, 4)}
        conv = rng.randrange(30)
        if kind == 0:
            return CHAT, {"model": "m", "messages": turns(rng.randint(1, 4), str(conv)), "prompt_cache_key": f"c{conv}", "x_fake": fake}
        if kind == 1:
            return CHAT, {"model": "m", "messages": turns(rng.randint(1, 4), str(conv)), "user": f"u{conv % 7}", "x_fake": fake, "stream": True}
        if kind == 2:
            return CHAT, {"model": "m", "messages": turns(rng.randint(1, 4), str(conv)), "x_fake": fake, "stream": rng.random() < 0.5}
        if kind == 3:
            return "/v1/completions", {"model": "m", "prompt": f"def f{conv}():\n" * rng.randint(1, 300), "x_fake": fake}
        if kind == 4:
            return "/v1/responses", {"model": "m", "instructions": "be brief", "input": f"q{conv}", "x_fake": fake}
        return CHAT, {"model": "m", "messages": [{"role": "user", "content": f"one-off {i}"}], "x_fake": fake, "stream": True}

    async def one(i: int) -> int | None:
        path, payload = body(i)
        leave_early = rng.random() < 0.05
        task = asyncio.ensure_future(f.client.post(path, json=payload))
        if leave_early:
            await asyncio.sleep(rng.random() * 0.01)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return None
        resp = await task
        await resp.read()
        return resp.status

    sampler = asyncio.create_task(sample())
    results: list[int | None] = []
    for start in range(0, 1000, 100):  # 100 clients at a time, one wave after another
        results += await asyncio.gather(*(one(i) for i in range(start, start + 100)))
    await eventually(lambda: all(u.inflight == 0 for u in ups), timeout=10, what="every slot back")
    sampling = False
    await sampler
    answered = [s for s in results if s is not None]
    assert len(answered) >= 900 and set(answered) == {200}, {s: answered.count(s) for s in set(answered)}
    f.assert_no_violations()
    assert peak == {"w0": 2, "w1": 2, "w2": 2}  # every gate was reached, none exceeded
    counts = routing(f)
    assert counts["affinity"] > 0 and counts["fallback_busy"] > 0 and counts["new"] > 0, counts
    assert len(answered) <= sum(counts.values()) <= 1000  # one decision per admitted request
    assert f.state.admissions["m"].waiting == 0


def with_cache(identity: dict, cache_id: str | None) -> dict:
    return {**identity, "prefix_cache": {"id": cache_id}}


@pytest.mark.parametrize("after", ["same", "another", "none"])
async def test_a_worker_restarted_with_its_disk_cache_keeps_its_conversations_and_only_then(make_fleet, after):
    ids = {"same": "c1", "another": "c2", "none": None}
    f = await make_fleet({"w0": {"gate": 1, "identity": identity_of(1, pid=10)},
                          "w1": {"gate": 1, "identity": with_cache(identity_of(1, pid=11), "c1")}})
    await wait_for(lambda: f.state.upstreams["w1"].cache_id == "c1", "the first identity")
    await first_turn_on_the_second_worker(f, prompt_cache_key="c")
    f.fakes["w1"].health_status = 503  # down for its restart
    await eventually(lambda: not f.state.upstreams["w1"].healthy, what="w1 unhealthy")
    f.fakes["w1"].identity = with_cache(identity_of(1, pid=12), ids[after])
    f.fakes["w1"].health_status = 200
    await eventually(lambda: f.state.upstreams["w1"].healthy, what="w1 back")
    await wait_for(lambda: f.collector.tracks["w1"].pid == 12, "the new pid")
    assert (await f.client.post(CHAT, json=chat(turns(2), "t2", prompt_cache_key="c"))).status == 200
    assert served_by(f, "t2") == ("w1" if after == "same" else "w0")
