"""The prefix cache in a running worker: what an agent's next turn reuses, as the client and /metrics see it."""

from __future__ import annotations

import openai
import pytest

from mtpstack.proxy.prometheus import unlabelled

SERIES = [f"mtpstack_worker_prefix_cache_{name}" for name in
          ("lookups_total", "hits_total", "tokens_reused_total", "evictions_total", "bytes")]


def parse_counters(text: str) -> dict[str, float]:
    return unlabelled(text, SERIES)

SYSTEM = "You are a coding agent. Tools: read_file(path), write_file(path, text), run(cmd). " * 6


def chat(client, messages, **kw):
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0, **kw)


@pytest.fixture(scope="module")
def pair(hybrid_pair):
    return hybrid_pair


def conversation(client) -> list:
    """Three turns of one conversation, each answer appended as the assistant turn; their responses."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "list the files"}]
    answers = []
    for follow_up in ["open a.py", "run the tests"]:
        answers.append(chat(client, messages))
        messages += [{"role": "assistant", "content": answers[-1].choices[0].message.content},
                     {"role": "user", "content": follow_up}]
    answers.append(chat(client, messages))
    return answers


def test_each_turn_reuses_the_previous_prompt_and_says_so_in_usage_and_metrics(live_worker, pair):
    with live_worker(*pair, depth=3, width=2) as cached, live_worker(*pair, depth=3, width=2, prefix_cache_gib=0) as plain:
        with_cache = conversation(openai.OpenAI(base_url=cached.url + "/v1", api_key="x", max_retries=0, timeout=60))
        without = conversation(openai.OpenAI(base_url=plain.url + "/v1", api_key="x", max_retries=0, timeout=60))
        assert [a.choices[0].message.content for a in with_cache] == [a.choices[0].message.content for a in without]
        first, *later = with_cache
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        for before, after in zip(with_cache, later):
            # every later turn resumes at least one token before where the previous turn's prompt ended
            assert after.usage.prompt_tokens_details.cached_tokens >= before.usage.prompt_tokens - 1
        assert all(a.usage.prompt_tokens_details.cached_tokens == 0 for a in without)
        metrics = parse_counters(cached.get_text("/metrics"))
        assert metrics["mtpstack_worker_prefix_cache_lookups_total"] == 3
        assert metrics["mtpstack_worker_prefix_cache_hits_total"] == 2
        assert metrics["mtpstack_worker_prefix_cache_tokens_reused_total"] == sum(
            a.usage.prompt_tokens_details.cached_tokens for a in later)
        assert 0 < metrics["mtpstack_worker_prefix_cache_bytes"] <= 2 * 2**30
        assert cached.get_json("/identity")["prefix_cache"] == {"max_gib": 2, "max_bytes": 2 * 2**30, "dir": None,
                                                                "disk_gib": 32, "disk_max_bytes": 32 * 2**30, "id": None}
        assert plain.get_json("/identity")["prefix_cache"]["max_bytes"] == 0
        assert parse_counters(plain.get_text("/metrics"))["mtpstack_worker_prefix_cache_lookups_total"] == 0


def test_identity_shows_the_disk_tiers_directory_and_both_budgets(live_worker, pair, tmp_path):
    folder = str(tmp_path / "cache")
    with live_worker(*pair, depth=2, width=1, prefix_cache_gib=0.5,
                     extra=["--prefix-cache-dir", folder, "--prefix-cache-disk-gib", "1.5"]) as w:
        shown = w.get_json("/identity")["prefix_cache"]
        # `id`: the disk tier's own, kept in its directory (a restart with the directory keeps it)
        assert shown == {"max_gib": 0.5, "max_bytes": 2**29, "dir": folder, "disk_gib": 1.5, "disk_max_bytes": 3 * 2**29,
                         "id": shown["id"]} and len(shown["id"]) == 16


def test_another_conversation_resumes_at_the_end_of_the_shared_system_prompt(live_worker, pair):
    with live_worker(*pair, depth=3, width=2) as w:
        client = openai.OpenAI(base_url=w.url + "/v1", api_key="x", max_retries=0, timeout=60)
        chat(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "list the files"}])
        other = chat(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "what is 2 + 2?"}])
        alone = chat(client, [{"role": "user", "content": SYSTEM}])  # same text, another role: shares almost nothing
        cached = other.usage.prompt_tokens_details.cached_tokens
        # the system message's own boundary, not only the last 512-token chunk boundary before it
        assert cached > 0 and cached % 512 != 0
        assert alone.usage.prompt_tokens_details.cached_tokens < cached


def test_a_responses_request_and_a_completion_reuse_the_cache_too(live_worker, pair):
    with live_worker(*pair, depth=2, width=1) as w:
        client = openai.OpenAI(base_url=w.url + "/v1", api_key="x", max_retries=0, timeout=60)
        prompt = SYSTEM + "\nuser: hi\nassistant:"
        first = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
        again = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
        assert first.choices[0].text == again.choices[0].text
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        r1 = client.responses.create(model="tiny", instructions=SYSTEM, input="hello", max_output_tokens=8)
        r2 = client.responses.create(model="tiny", instructions=SYSTEM, input="hello", max_output_tokens=8)
        assert r2.usage.input_tokens_details.cached_tokens == r2.usage.input_tokens - 1 > 0
        assert r1.output_text == r2.output_text


def test_a_flood_of_distinct_prompts_stays_within_the_budget(live_worker, pair):
    budget_gib = 0.0005  # about 512 KiB: a handful of this model's snapshots
    with live_worker(*pair, depth=2, width=2, prefix_cache_gib=budget_gib) as w:
        client = openai.OpenAI(base_url=w.url + "/v1", api_key="x", max_retries=0, timeout=60)
        for i in range(12):
            client.completions.create(model="tiny", prompt=f"{i} " + SYSTEM, max_tokens=1, temperature=0)
            metrics = parse_counters(w.get_text("/metrics"))
            assert metrics["mtpstack_worker_prefix_cache_bytes"] <= budget_gib * 2**30
        assert metrics["mtpstack_worker_prefix_cache_evictions_total"] > 0
        assert w.get_json("/health")["status"] == "ok"
