"""`n` > 1: each choice is a row of the batch, and they share one prefill of the prompt."""

from __future__ import annotations

import json

import openai
import pytest

from mtpstack.proxy.prometheus import unlabelled

ASK = [{"role": "user", "content": "Tell me about the weather in Paris and in Oslo, please."}]
NOTE = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object", "properties": {"text": {"type": "string", "maxLength": 8}}, "required": ["text"]}}}


@pytest.fixture(scope="module")
def worker(hybrid_pair, tmp_path_factory, live_worker_class):
    with live_worker_class(tmp_path_factory.mktemp("n"), *hybrid_pair, depth=2, width=3) as w:
        yield w


def counter(worker, name: str) -> float:
    return unlabelled(worker.get_text("/metrics"), [name]).get(name, 0.0)


def test_greedy_choices_equal_the_single_answer_and_share_one_prefill(worker, client):
    prompt = [{"role": "user", "content": "A fresh prompt for the n test, never sent before."}]
    single = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=12, temperature=0)
    hits = counter(worker, "mtpstack_worker_prefix_cache_hits_total")
    three = client.chat.completions.create(model="tiny", messages=prompt, max_tokens=12, temperature=0, n=3)
    assert counter(worker, "mtpstack_worker_prefix_cache_hits_total") - hits == 2  # choices 1 and 2 resumed choice 0's
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert len({c.message.content for c in three.choices}) == 1
    again = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=12, temperature=0, n=2)
    assert [c.message.content for c in again.choices] == [single.choices[0].message.content] * 2
    assert again.usage.prompt_tokens == single.usage.prompt_tokens
    assert again.usage.completion_tokens == 2 * single.usage.completion_tokens


def test_streamed_choices_come_under_their_index(client):
    texts = {}
    for chunk in client.chat.completions.create(model="tiny", messages=ASK, max_tokens=12, temperature=0, n=3, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    whole = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=12, temperature=0)
    assert texts == {i: whole.choices[0].message.content for i in range(3)}


def test_seeded_choices_differ_from_each_other(client):
    kw = dict(model="tiny", messages=ASK, max_tokens=16, temperature=1.0, seed=7, n=2)
    first = [c.message.content for c in client.chat.completions.create(**kw).choices]
    assert first[0] != first[1]  # choice i samples with seed + i


def test_each_choice_keeps_its_own_grammar_state(client):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[NOTE], tool_choice="required", max_tokens=80,
                                       temperature=1.0, seed=3, n=3)
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        assert set(json.loads(c.message.tool_calls[0].function.arguments)) == {"text"}


def test_more_choices_than_the_batch_width_is_a_400_naming_n(worker):
    status, _, payload = worker.post_json("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "n": 4})
    assert (status, payload["error"]["param"]) == (400, "n")
    assert "batch width (3)" in payload["error"]["message"]


LONG = [{"role": "user", "content": "Summarize the design of a prefix cache for an agent, step by step. " * 12}]


@pytest.mark.parametrize("cache_gib", [2, 0], ids=["a cache", "no cache"])
def test_the_choices_share_one_prefill_with_or_without_a_cache(hybrid_pair, live_worker, cache_gib):
    with live_worker(*hybrid_pair, depth=2, width=3, prefix_cache_gib=cache_gib) as w:
        client = openai.OpenAI(base_url=w.url + "/v1", api_key="unused", timeout=60, max_retries=0)
        before = counter(w, "mtpstack_worker_prefill_tokens_total")
        # a long stop string that never matches: the first choice's first event comes only at its end
        r = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=16, temperature=0, n=3, stop=["z" * 40])
        prefilled = counter(w, "mtpstack_worker_prefill_tokens_total") - before
        single = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=16, temperature=0)
    n = r.usage.prompt_tokens
    assert prefilled == n + 2  # the prompt once, then one token for each other choice
    assert [c.message.content for c in r.choices] == [single.choices[0].message.content] * 3


def test_one_prompt_sent_twice_at_once_is_prefilled_once(hybrid_pair, live_worker):
    from concurrent.futures import ThreadPoolExecutor

    prompt = [{"role": "user", "content": "Two clients ask the same long question at the same time. " * 12}]
    with live_worker(*hybrid_pair, depth=2, width=2) as w:
        client = openai.OpenAI(base_url=w.url + "/v1", api_key="unused", timeout=60, max_retries=0)
        before = counter(w, "mtpstack_worker_prefill_tokens_total")
        ask = lambda _: client.chat.completions.create(model="tiny", messages=prompt, max_tokens=12, temperature=0)  # noqa: E731
        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(ask, range(2))
        prefilled = counter(w, "mtpstack_worker_prefill_tokens_total") - before
    assert prefilled == a.usage.prompt_tokens + 1
    assert sorted([a.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens_details.cached_tokens]) == [0, a.usage.prompt_tokens - 1]
    assert a.choices[0].message.content == b.choices[0].message.content
