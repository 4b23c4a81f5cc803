"""The feature table of docs/agent-api.md, row by row: ours, and `mlx_lm.server` 0.32.2 where it has the feature.

Both serve the same tiny model on loopback (ours without a drafter, as mlx-lm's server would run
it), driven with the official client. Each test is one row; a row mlx-lm lacks asserts how it
answers instead (ignored or 404), so the table cannot drift from what either server does.
"""

from __future__ import annotations

import json
import os
import sys

import openai
import pytest

from mtpstack.runtime import Process, StartError, free_port, url_of
from devkit.demo.agent import build_agent_pair

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
#: mlx-lm's server loads a tiny model in well under a second; the bound covers a busy 2-core machine.
START_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_agent_pair(tmp_path_factory.mktemp("peer"), seed=0)


@pytest.fixture(scope="module")
def ours(pair, tmp_path_factory, live_worker_class):
    with live_worker_class(tmp_path_factory.mktemp("ours"), pair[0], None, width=1) as w:
        yield openai.OpenAI(base_url=w.url + "/v1", api_key="unused", timeout=60, max_retries=0), "tiny"


@pytest.fixture(scope="module")
def mlx_lm(pair, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlxlm")
    port = free_port()
    env = {**os.environ, "HF_HUB_CACHE": str(tmp), "HF_HUB_OFFLINE": "1"}
    proc = Process([sys.executable, "-m", "mlx_lm.server", "--model", str(pair[0]), "--host", "127.0.0.1",
                    "--port", str(port), "--prompt-cache-size", "0"], log_path=tmp / "server.log", name="mlx_lm.server",
                   kind="peer server", url=url_of("127.0.0.1", port), env=env).start()
    try:
        try:
            proc.wait_ready("/health", START_TIMEOUT, state="healthy")
        except StartError as e:
            pytest.fail(f"mlx_lm.server did not start: {e}")
        yield openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", timeout=60, max_retries=0), str(pair[0])
    finally:
        proc.stop()


@pytest.fixture(params=["ours", "mlx_lm"])
def server(request):
    return request.param, request.getfixturevalue(request.param)


def test_row_reasoning_text_goes_to_the_reasoning_field(server):
    _, (client, model) = server
    msg = client.chat.completions.create(model=model, messages=ASK, max_tokens=10, temperature=0).choices[0].message
    assert getattr(msg, "reasoning", None) and not msg.content


def test_row_chat_template_kwargs_reach_the_template(server):
    _, (client, model) = server
    msg = client.chat.completions.create(model=model, messages=ASK, max_tokens=10, temperature=0,
                                         extra_body=NO_THINK).choices[0].message
    assert msg.content and not getattr(msg, "reasoning", None)


def test_row_tools_and_tool_history_are_accepted(server):
    _, (client, model) = server
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    out = client.chat.completions.create(model=model, messages=history, tools=[TOOL], max_tokens=4, temperature=0)
    assert out.usage.prompt_tokens > 60  # the tools and the call were rendered into the prompt


def test_row_chat_logprobs_cover_every_token(server):
    _, (client, model) = server
    out = client.chat.completions.create(model=model, messages=ASK, max_tokens=6, temperature=0, logprobs=True,
                                         top_logprobs=3, extra_body=NO_THINK)
    entries = out.choices[0].logprobs.content
    assert len(entries) == out.usage.completion_tokens == 6
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in entries)


def test_row_forced_tool_call(server):
    name, (client, model) = server
    out = client.chat.completions.create(model=model, messages=ASK, tools=[TOOL], tool_choice="required", max_tokens=60,
                                         temperature=0, extra_body=NO_THINK)
    calls = out.choices[0].message.tool_calls
    if name == "ours":
        assert calls and json.loads(calls[0].function.arguments).keys() == {"city"}
    else:  # mlx-lm ignores tool_choice: a random model writes no call
        assert not calls


def test_row_json_schema_output(server):
    name, (client, model) = server
    out = client.chat.completions.create(model=model, messages=ASK, max_tokens=20, temperature=0, extra_body=NO_THINK,
                                         response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}})
    text = out.choices[0].message.content
    if name == "ours":
        assert json.loads(text) in ({"ok": True}, {"ok": False})
    else:  # mlx-lm ignores response_format
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_row_responses_api(server):
    name, (client, model) = server
    if name == "ours":
        assert client.responses.create(model=model, input="hi", max_output_tokens=4, extra_body=NO_THINK).output_text
    else:
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=model, input="hi", max_output_tokens=4)
