"""Tools on a model whose chat template has no tool-call format (the demo tokenizer's plain ChatML):
the generic format, end to end with the official client."""

from __future__ import annotations

import json

import pytest
from mlx_lm.utils import load_tokenizer

from mtpstack.worker.protocol.chat import prepare
from mtpstack.worker.protocol.generic import TOOL_END, TOOL_START, parse_call, rewrite
from mtpstack.worker.protocol.output import OutputSplitter

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}
NOTE = {"type": "function", "function": {"name": "note", "strict": True, "parameters": {
    "type": "object", "properties": {"text": {"type": "string", "maxLength": 8}}, "required": ["text"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def worker(tiny_pair, tmp_path_factory, live_worker_class):
    with live_worker_class(tmp_path_factory.mktemp("generic"), *tiny_pair, depth=2, width=2) as w:
        yield w


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "note"}}])
def test_a_forced_call_is_served_on_a_template_without_a_tool_format(client, choice):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, NOTE], tool_choice=choice,
                                       max_tokens=80, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls", repr(r.choices[0].message)
    [call] = r.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    if choice != "required":
        assert call.function.name == "note"
    if call.function.name == "note":
        assert set(args) == {"text"} and len(args["text"]) <= 8
    else:
        assert set(args) >= {"city", "days"} and isinstance(args["days"], int)
    assert not r.choices[0].message.content


def test_the_call_round_trips_and_auto_is_served(client):
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=80, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    again = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], max_tokens=8, temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    streamed = client.responses.create(model="tiny", input="hi", tools=[{"type": "function", "name": "note",
                                       "parameters": NOTE["function"]["parameters"]}], tool_choice="required",
                                       max_output_tokens=60)
    assert [i.type for i in streamed.output] == ["function_call"]


def test_the_tools_are_described_in_a_system_message_and_the_history_rewritten(tiny_pair):
    tok = load_tokenizer(tiny_pair[0])
    assert not tok.has_tool_calling
    messages = [{"role": "system", "content": "Be brief."}, *ASK,
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}, {"role": "user", "content": "And tomorrow?"}]
    out = rewrite(messages, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.") and '"name": "get_weather"' in out[0]["content"]
    assert TOOL_START in out[2]["content"] and "tool_calls" not in out[2]
    assert out[3]["content"] == "<tool_response>\nsunny\n</tool_response>\nAnd tomorrow?"
    assert "# Tools" not in rewrite(messages, None)[0]["content"]  # `tool_choice: none` describes none


def test_auto_output_is_split_into_calls_and_a_broken_block_stays_content(tiny_pair):
    class Engine:
        tokenizer = load_tokenizer(tiny_pair[0])

    agent = prepare({"messages": ASK, "tools": [WEATHER]}, "chat", Engine())
    split = OutputSplitter(agent.output.markers, False, [WEATHER])
    pieces = split.feed(f'Sure.\n{TOOL_START}\n{{"name": "get_weather", "arguments": {{"city": "Oslo", "days": 2}}}}\n{TOOL_END}')
    pieces += split.finish()
    assert [p.kind for p in pieces] == ["content", "tool_call"]
    assert json.loads(pieces[1].call["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    broken = OutputSplitter(agent.output.markers, False, [WEATHER])
    text = f"{TOOL_START}\nnot json\n{TOOL_END}"
    assert "".join(p.text for p in broken.feed(text) + broken.finish()) == text
    with pytest.raises(ValueError):
        parse_call('{"name": "f", "arguments": [1]}')


def test_a_forced_call_with_an_unbounded_string_ends_within_max_tokens(client):
    shell = {"type": "function", "function": {"name": "shell", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[shell], tool_choice="required",
                                       max_tokens=100, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls", repr(r.choices[0].message)
    assert len(json.loads(r.choices[0].message.tool_calls[0].function.arguments)["command"]) <= 50
