"""The demo as `mtpstack up` ships it serves what an agent needs out of the box: calls in its own
`qwen3_coder` format, reasoning turned on and off by the request, and structured output."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from mtpstack.runtime import free_port
from mtpstack.up import DEMO_MODEL, default_fleet
from tests.e2e.conftest import running_stack, wait_until

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "population": {"type": "integer"}},
    "required": ["name", "population"]}}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    config = default_fleet()
    config["proxy"]["port"] = free_port()
    config["workers"]["demo"]["port"] = free_port()
    with running_stack(tmp_path_factory.mktemp("demo"), config) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack.proxy_url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_up_prints_each_agents_line_with_the_context_window_the_demo_serves(stack):
    """The window `up` prints is what the worker serves (its `/identity`), and at least 128k tokens: today's
    agents in a real repository send 22-38k tokens before the first word of the conversation."""
    window = json.loads(urllib.request.urlopen(stack.worker_url("demo") + "/identity", timeout=30).read())["context_length"]
    assert window >= 131072
    wait_until(lambda: "opencode" in (stack.root / "up.out").read_text(), 30, "the ready banner")
    banner = (stack.root / "up.out").read_text()
    assert (f"ANTHROPIC_BASE_URL={stack.proxy_url} " in banner and f"ANTHROPIC_MODEL={DEMO_MODEL} " in banner
            and f"CLAUDE_CODE_AUTO_COMPACT_WINDOW={window} claude" in banner), banner
    assert f"model_context_window = {window}\n" in banner and f"model_auto_compact_token_limit = {int(window * 0.9)}\n" in banner
    assert f'base_url = "{stack.proxy_url}/v1"' in banner
    opencode = json.loads(banner.split("opencode, in opencode.json:\n", 1)[1].splitlines()[0])
    assert opencode["provider"]["mtpstack"]["models"][DEMO_MODEL]["limit"]["context"] == window


@pytest.mark.parametrize("path", ["/", "/api/hello"])
def test_claude_codes_reachability_probe_is_answered_by_the_proxy_and_the_worker(stack, path):
    for url in (stack.proxy_url, stack.worker_url("demo")):
        with urllib.request.urlopen(urllib.request.Request(url + path, method="HEAD"), timeout=30) as resp:
            assert resp.status == 200, url + path


def chat(client, **kw):
    return client.chat.completions.create(model=DEMO_MODEL, messages=kw.pop("messages", ASK), temperature=0, **kw)


def test_a_forced_call_is_written_in_the_qwen3_coder_format_and_round_trips(client):
    r = chat(client, tools=[WEATHER], tool_choice="required", max_tokens=160, logprobs=True)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}
    # What the model wrote: the template's own XML blocks (its special tokens), not the generic JSON.
    raw = "".join(t.token for t in choice.logprobs.content)
    assert raw.startswith("<tool_call>\n<function=get_weather>\n<parameter=city>\n"), raw
    assert raw.endswith("</parameter>\n</function>\n</tool_call>"), raw
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    again = chat(client, messages=history, tools=[WEATHER], max_tokens=8)
    assert again.choices[0].finish_reason in ("stop", "length")
    assert again.usage.prompt_tokens > r.usage.prompt_tokens


def test_a_forced_call_over_the_responses_api(client):
    tool = {"type": "function", **WEATHER["function"]}
    r = client.responses.create(model=DEMO_MODEL, input="What is the weather in Paris?", tools=[tool],
                                tool_choice="required", max_output_tokens=160, temperature=0)
    [call] = [i for i in r.output if i.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}


def test_thinking_is_off_by_default_and_reasoning_effort_turns_it_on_and_off(client):
    plain = chat(client, max_tokens=24).choices[0].message
    off = chat(client, max_tokens=24, reasoning_effort="none").choices[0].message
    on = chat(client, max_tokens=24, reasoning_effort="high").choices[0].message
    assert plain.content and not getattr(plain, "reasoning", None)
    assert off.content == plain.content and not getattr(off, "reasoning", None)
    # With thinking on, the toy's few words go to the reasoning field, not the answer.
    assert getattr(on, "reasoning", None) and not on.content
    via_kwargs = chat(client, max_tokens=24, extra_body={"chat_template_kwargs": {"enable_thinking": True}}).choices[0].message
    assert via_kwargs.model_dump().get("reasoning") == on.model_dump().get("reasoning")


@pytest.mark.parametrize("effort", ["none", "high"])
def test_the_demo_ends_its_turns(client, effort):
    """An agent that checks (Codex: "Incomplete response ... max_output_tokens") needs a turn that
    ends: the demo writes `<|im_end|>` well within `max_tokens`, thinking off and on."""
    for content in ("What is the weather in Paris?", "hello", "def parse(path):"):
        r = chat(client, messages=[{"role": "user", "content": content}], max_tokens=96, reasoning_effort=effort)
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens < 96, message
        assert message.content or getattr(message, "reasoning", None)


def test_with_thinking_on_a_forced_call_still_arrives_after_the_reasoning(client):
    r = chat(client, tools=[WEATHER], tool_choice="required", max_tokens=200, reasoning_effort="high")
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and getattr(message, "reasoning", None)
    [call] = message.tool_calls
    assert set(json.loads(call.function.arguments)) == {"city"}


@pytest.mark.parametrize("effort", [None, "high"])
def test_structured_output_parses_and_keeps_to_the_schema(client, effort):
    extra = {"reasoning_effort": effort} if effort else {}
    r = chat(client, response_format=CITY, max_tokens=160, **extra)
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"name", "population"} and isinstance(value["population"], int)
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
