"""The turn boundary: with the demo's own template (the Qwen3.5 family's), each next turn of a chat
prefills only its new messages, thinking on and off, and the text is what the worker says without a cache.

The family's generation prompt ends `<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n` (thinking off) or
`...<think>\\n` (on), while the next turn's history renders that assistant turn without it: the next prompt
leaves the previous one a few tokens before its end. The worker also snapshots where the conversation
ends without its generation prompt, so the next turn resumes there.
"""

from __future__ import annotations

import openai
import pytest

from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

#: What a next turn may prefill beyond its new messages: the generation prompt (8 tokens with the
#: demo's template, thinking off) and a token or two where the answer meets it.
SLACK_TOKENS = 16
SYSTEM = ("You are a coding agent in a repository. Tools: read_file(path), write_file(path, text), run(cmd). "
          "Answer briefly and say which tool you would use. ") * 4
FOLLOW_UPS = ["open the failing test", "show me line 40", "fix the off-by-one", "run the tests again"]
THINKING = {"off": {"enable_thinking": False}, "on": {"enable_thinking": True}}


@pytest.fixture(scope="module")
def workers(live_worker_class, tmp_path_factory):
    """The demo pair with the default prefix cache, and with none."""
    tmp = tmp_path_factory.mktemp("turns")
    with live_worker_class(tmp, DEMO_TARGET, DEMO_HEAD, depth=3, width=1, name="demo") as cached, \
            live_worker_class(tmp, DEMO_TARGET, DEMO_HEAD, depth=3, width=1, name="demo", prefix_cache_gib=0) as plain:
        yield cached, plain


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(DEMO_TARGET)


def rendered(tokenizer, messages, kwargs) -> int:
    """Tokens of `messages` with the demo's template and no generation prompt."""
    from mtpstack.worker.protocol.chat import render_template

    return len(render_template(tokenizer, messages, None, kwargs, add_generation_prompt=False))


def converse(url: str, kwargs: dict, system: str) -> list[tuple[list[dict], object]]:
    """A 5-turn conversation through `/v1/chat/completions`; each answer goes back as the client sends it."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "what is failing?"}]
    turns = []
    for follow_up in [*FOLLOW_UPS, None]:
        answer = client.chat.completions.create(model="demo", messages=messages, max_tokens=24, temperature=0,
                                                extra_body={"chat_template_kwargs": kwargs})
        turns.append((list(messages), answer))
        if follow_up is None:
            break
        message = answer.choices[0].message
        said = {"role": "assistant", "content": message.content or ""}
        if getattr(message, "reasoning_content", None):
            said["reasoning_content"] = message.reasoning_content
        messages = messages + [said, {"role": "user", "content": follow_up}]
    return turns


@pytest.mark.parametrize("thinking", list(THINKING))
def test_each_next_turn_prefills_only_its_new_messages_and_the_text_is_unchanged(workers, tokenizer, thinking):
    cached, plain = workers
    kwargs = THINKING[thinking]
    system = f"Thinking {thinking}. {SYSTEM}"  # a conversation of its own: nothing cached by the other case
    with_cache, without = converse(cached.url, kwargs, system), converse(plain.url, kwargs, system)
    assert [a.choices[0].message for _, a in with_cache] == [a.choices[0].message for _, a in without]
    assert with_cache[0][1].usage.prompt_tokens_details.cached_tokens == 0
    for (before, _), (messages, answer) in zip(with_cache, with_cache[1:]):
        new = rendered(tokenizer, messages, kwargs) - rendered(tokenizer, before, kwargs)
        usage = answer.usage
        prefilled = usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens
        assert prefilled <= new + SLACK_TOKENS, (
            f"turn {len(messages) // 2}: {prefilled} tokens prefilled for {new} tokens of new messages")


def test_the_boundaries_are_where_the_system_messages_and_the_conversation_end(tokenizer):
    from mtpstack.worker.protocol.chat import conversation_boundaries, render_template

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "what is failing?"},
                {"role": "assistant", "content": "the parser"}, {"role": "user", "content": "fix it"}]
    for kwargs in THINKING.values():
        prompt = list(render_template(tokenizer, messages, None, kwargs, add_generation_prompt=True))
        system, end = (len(render_template(tokenizer, messages[:n], None, kwargs, add_generation_prompt=False)) for n in (1, 4))
        assert conversation_boundaries(tokenizer, messages, None, kwargs, prompt) == (system, end)
        assert 0 < system < end < len(prompt)
    # a conversation the prompt does not begin with (a last assistant message continued) gives only what it begins with
    continued = messages[:3]
    prompt = list(render_template(tokenizer, continued, None, {}, add_generation_prompt=False))
    assert conversation_boundaries(tokenizer, continued, None, {}, prompt) == (
        len(render_template(tokenizer, continued[:1], None, {}, add_generation_prompt=False)),)


def test_a_responses_conversation_resumes_where_its_messages_ended_too(workers, tokenizer):
    from mtpstack.worker.protocol.responses import to_chat

    cached, _ = workers
    client = openai.OpenAI(base_url=cached.url + "/v1", api_key="x", max_retries=0, timeout=120)
    body = {"model": "demo", "instructions": "Responses. " + SYSTEM, "max_output_tokens": 24,
            "input": [{"role": "user", "content": "what is failing?"}]}
    first = client.responses.create(**body)
    nxt = dict(body, input=body["input"] + [{"role": "assistant", "content": first.output_text},
                                              {"role": "user", "content": "open the failing test"}])
    second = client.responses.create(**nxt)
    new = rendered(tokenizer, to_chat(nxt)["messages"], {}) - rendered(tokenizer, to_chat(body)["messages"], {})
    prefilled = second.usage.input_tokens - second.usage.input_tokens_details.cached_tokens
    assert 0 < prefilled <= new + SLACK_TOKENS
