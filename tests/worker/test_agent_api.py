"""The agent API end to end: a real worker on a tokenizer with the Qwen3.5 family's markers, the official client.

The tiny model's weights are random, so its text is gibberish; calls and JSON are made
deterministic by constrained decoding (`tool_choice: required`, `response_format`), which is what
an agent relies on, and reasoning by the template opening `<think>` in the prompt.
"""

from __future__ import annotations

import json
import math

import pytest

from devkit.demo.agent import build_agent_pair

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
                           "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "days"],
        },
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "maxLength": 16}}, "required": ["query"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "role": {"enum": ["admin", "user"]}},
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def agent_pair(tmp_path_factory):
    return build_agent_pair(tmp_path_factory.mktemp("agent"), seed=0)


@pytest.fixture(scope="module")
def worker(agent_pair, tmp_path_factory, live_worker_class):
    with live_worker_class(tmp_path_factory.mktemp("agentw"), *agent_pair, depth=3, width=2) as w:
        yield w


def check_weather_args(args: dict) -> None:
    assert set(args) >= {"city", "days"} and set(args) <= {"city", "days", "unit"}
    assert isinstance(args["city"], str) and 0 < len(args["city"]) <= 16 and "<" not in args["city"]
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 9
    assert args.get("unit", "c") in ("c", "f")


def test_tool_choice_required_yields_a_valid_call_that_round_trips_through_a_tool_message(client):
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, SEARCH], tool_choice="required",
                                           max_tokens=120, temperature=0, extra_body=NO_THINK)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name in ("get_weather", "search")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        check_weather_args(args)
    else:
        assert set(args) == {"query"}
    assert not choice.message.content

    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER, SEARCH], max_tokens=8,
                                            temperature=0, extra_body=NO_THINK)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens


def test_a_named_tool_choice_calls_that_function(client):
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, SEARCH], max_tokens=120, temperature=0,
                                         tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                         extra_body=NO_THINK)
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    check_weather_args(json.loads(call.function.arguments))


def test_a_streamed_tool_call_reassembles_to_the_non_streamed_one(client):
    kw = dict(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=120, temperature=0,
              extra_body=NO_THINK)
    whole = client.chat.completions.create(**kw).choices[0]
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            slot["name"] += tc.function.name or ""
            slot["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == ""
    [w] = whole.message.tool_calls
    assert calls == {0: {"name": w.function.name, "arguments": w.function.arguments}}


def test_tool_choice_none_keeps_tools_in_the_prompt_and_never_calls(client):
    with_tools = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="none",
                                                max_tokens=30, temperature=0, extra_body=NO_THINK)
    without = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=30, temperature=0, extra_body=NO_THINK)
    msg = with_tools.choices[0].message
    assert not msg.tool_calls and "<tool_call>" not in (msg.content or "")
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens
    assert with_tools.choices[0].finish_reason in ("stop", "length")


def test_thinking_text_goes_to_reasoning_and_enable_thinking_false_reaches_the_template(client):
    thinking = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=20, temperature=0)
    plain = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=20, temperature=0, extra_body=NO_THINK)
    # The template opens <think> in the prompt, so the model's text starts as reasoning.
    reasoning = getattr(thinking.choices[0].message, "reasoning", None)
    assert reasoning and "</think>" not in reasoning and "<think>" not in (thinking.choices[0].message.content or "")
    assert getattr(plain.choices[0].message, "reasoning", None) is None and plain.choices[0].message.content
    assert plain.usage.prompt_tokens > thinking.usage.prompt_tokens  # the template closed the think block


def test_streamed_reasoning_and_content_reassemble_to_the_non_streamed_message(client):
    for extra in ({}, NO_THINK):
        kw = dict(model="tiny", messages=ASK, max_tokens=24, temperature=0, extra_body=extra)
        whole = client.chat.completions.create(**kw).choices[0].message
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(**kw, stream=True):
            d = chunk.choices[0].delta
            reasoning += getattr(d, "reasoning", None) or ""
            content += d.content or ""
        assert (reasoning, content) == (getattr(whole, "reasoning", None) or "", whole.content or "")


def test_history_accepts_reasoning_under_either_name(client):
    sizes = set()
    for key in ("reasoning", "reasoning_content"):
        history = ASK + [{"role": "assistant", "content": "It is sunny.", key: "Paris is in France."},
                         {"role": "user", "content": "Thanks"}]
        out = client.chat.completions.create(model="tiny", messages=history, max_tokens=2, temperature=0)
        sizes.add(out.usage.prompt_tokens)
    without = ASK + [{"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks"}]
    base = client.chat.completions.create(model="tiny", messages=without, max_tokens=2, temperature=0).usage.prompt_tokens
    assert len(sizes) == 1 and sizes.pop() > base


def check_person(obj: dict) -> None:
    assert set(obj) == {"name", "age", "role"}
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 12
    assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 120 and obj["role"] in ("admin", "user")


@pytest.mark.parametrize("depth", [0, 3])
def test_json_schema_output_parses_and_validates_with_and_without_the_drafter(client, depth):
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "A person as JSON"}], max_tokens=120, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        extra_body={**NO_THINK, "num_draft_tokens": depth},
    )
    check_person(json.loads(out.choices[0].message.content))
    assert out.choices[0].finish_reason == "stop"


def test_constrained_output_is_the_same_with_and_without_speculation(client):
    answers, drafted = set(), []
    for depth in (0, 1, 3):
        out = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "JSON please"}], max_tokens=120, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
            extra_body={**NO_THINK, "num_draft_tokens": depth})
        answers.add(out.choices[0].message.content)
        drafted.append(out.usage.model_extra["draft_tokens"])
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    assert len(answers) == 1 and drafted[0] == 0 and drafted[2] > 0


def test_chat_logprobs_have_the_openai_shape_and_greedy_picks_the_top_alternative(client):
    out = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=12, temperature=0, logprobs=True,
                                         top_logprobs=5, extra_body=NO_THINK)
    entries = out.choices[0].logprobs.content
    assert len(entries) == out.usage.completion_tokens
    assert "".join(e.token for e in entries) == out.choices[0].message.content
    for e in entries:
        assert len(e.top_logprobs) == 5 and e.logprob <= 0
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-4


def test_logprobs_are_the_raw_distribution_not_the_grammar_masked_one(client):
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "JSON please"}], max_tokens=40, temperature=0, logprobs=True,
        top_logprobs=3, response_format={"type": "json_object"}, extra_body=NO_THINK)
    entries = out.choices[0].logprobs.content
    # The grammar forces `{` first; under the raw distribution it is not certain (a random model).
    assert entries[0].token == "{" and entries[0].logprob < -1e-3


def test_completions_logprobs_have_their_own_shape(client):
    out = client.completions.create(model="tiny", prompt="def main():", max_tokens=10, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    assert all(len(top) <= 3 and max(top.values()) == pytest.approx(v, abs=1e-5) for top, v in zip(lp.top_logprobs, lp.token_logprobs))


def test_streamed_logprobs_match_the_non_streamed_ones(client):
    kw = dict(model="tiny", messages=ASK, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2, extra_body=NO_THINK)
    whole = [(e.token, e.logprob) for e in client.chat.completions.create(**kw).choices[0].logprobs.content]
    streamed = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += [(e.token, e.logprob) for e in chunk.choices[0].logprobs.content]
    assert [t for t, _ in streamed] == [t for t, _ in whole]
    assert all(a == pytest.approx(b, abs=1e-4) for (_, a), (_, b) in zip(streamed, whole))


def tool_with(**params) -> dict:
    """WEATHER with some of its `parameters` replaced."""
    return {"type": "function", "function": {**WEATHER["function"], "parameters": {**WEATHER["function"]["parameters"], **params}}}


def history_arguments(arguments: str) -> dict:
    """A history whose assistant turn called a tool with these `arguments`."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return {"messages": [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [WEATHER] * 129}, "tools"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {f"k{i}": {"type": "string", "description": "x" * 64} for i in range(1000)}}}}},
         "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_object"}, "tools": [WEATHER], "tool_choice": "required"}, "response_format"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
         "messages[0].tool_calls[0].function.arguments"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        # Each of these answered 500 with a traceback (issue 23).
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": "get_weather"}}, "tool_choice"),
        ({"tools": [tool_with(required=[{"a": 1}])], "tool_choice": "required"}, "tools[0].function.parameters.required"),
        ({"tools": [tool_with(required="city")], "tool_choice": "required"}, "tools[0].function.parameters.required"),
        (history_arguments("[" * 50_000 + "]" * 50_000), "messages[1].tool_calls[0].function.arguments"),
        (history_arguments('{"x": ' + "9" * 5000 + "}"), "messages[1].tool_calls[0].function.arguments"),
        (history_arguments("[1, 2]"), "messages[1].tool_calls[0].function.arguments"),
        # ... and these were served (issue 23).
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]}, "tools[0].function.parameters"),
        ({"tools": [tool_with(properties={"city": 5})]}, "tools[0].function.parameters.properties"),
        ({"messages": [*ASK, {"role": "tool", "tool_call_id": 7, "content": "sunny"}]}, "messages[1].tool_call_id"),
        ({"messages": [*ASK, {"role": "assistant", "content": "", "tool_calls": [
            {"id": {"a": 1}, "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[1].tool_calls[0].id"),
    ],
)
def test_agent_fields_it_cannot_honour_are_a_400_naming_the_field(worker, body, param):
    status, _, payload = worker.post_json("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **body})
    assert (status, payload["error"]["param"]) == (400, param), payload
    assert payload["error"]["type"] == "invalid_request_error"


def test_completions_logprobs_past_five_are_refused(worker):
    status, _, payload = worker.post_json("/v1/completions", {"prompt": "x", "logprobs": 6})
    assert (status, payload["error"]["param"]) == (400, "logprobs")


# -- the Responses API ------------------------------------------------------------------


def test_responses_answers_text_with_usage(client):
    r = client.responses.create(model="tiny", input="Say hi", max_output_tokens=12, temperature=0,
                                extra_body=NO_THINK)
    assert r.object == "response" and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.usage.output_tokens == 12 and r.usage.input_tokens > 0
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Say hi"}], max_tokens=12,
                                          temperature=0, extra_body=NO_THINK)
    assert r.output_text == chat.choices[0].message.content


def test_responses_reasoning_is_its_own_output_item(client):
    r = client.responses.create(model="tiny", input="Say hi", max_output_tokens=12, temperature=0)
    assert [item.type for item in r.output] == ["reasoning"] and r.output_text == ""
    assert r.output[0].content[0].text


def test_responses_forced_function_call_round_trips_through_its_output(client):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    r = client.responses.create(model="tiny", input="Weather in Paris?", tools=[tool], tool_choice="required",
                                max_output_tokens=120, temperature=0, extra_body=NO_THINK)
    [call] = [item for item in r.output if item.type == "function_call"]
    check_weather_args(json.loads(call.arguments))
    follow = client.responses.create(
        model="tiny", max_output_tokens=4, temperature=0, tools=[tool], extra_body=NO_THINK,
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert follow.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens


def test_responses_text_format_json_schema_is_enforced(client):
    r = client.responses.create(model="tiny", input="A person", max_output_tokens=120, temperature=0, extra_body=NO_THINK,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    check_person(json.loads(r.output_text))


def test_responses_stream_events_reassemble_to_the_non_streamed_response(client):
    kw = dict(model="tiny", input="Say hi", max_output_tokens=16, temperature=0)
    whole = client.responses.create(**kw)
    types, text, reasoning, final = [], "", "", None
    for event in client.responses.create(**kw, stream=True):
        types.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.reasoning_text.delta":
            reasoning += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.incomplete"
    assert text == whole.output_text and reasoning == whole.output[0].content[0].text
    assert [i.type for i in final.output] == [i.type for i in whole.output]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "frob"}}}}, "text"),
        ({"input": []}, "input"),
        # Served, or a 500 with a traceback, before issue 23.
        ({"text": "x"}, "text"),
        ({"input": [{"type": "function_call", "call_id": {"a": 1}, "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 50_000 + "]" * 50_000}]},
         "input[0].arguments"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"x": ' + "9" * 5000 + "}"}]},
         "input[0].arguments"),
        ({"input": [{"type": "function_call_output", "call_id": 7, "output": "sunny"}]}, "input[0].call_id"),
        ({"tools": [{"type": "function", "name": "f", "parameters": 5}]}, "tools[0].parameters"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "required": [1]}}],
          "tool_choice": "required"}, "tools[0].parameters.required"),
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": {"x": 1}}}, "tool_choice"),
    ],
)
def test_responses_refusals_name_the_responses_field(worker, body, param):
    status, _, payload = worker.post_json("/v1/responses", {"input": "hi", **body})
    assert (status, payload["error"]["param"]) == (400, param), payload
    assert ".function." not in payload["error"]["message"]  # the chat request's paths never show


def test_an_invalid_pattern_is_refused_with_its_whole_reason(worker):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(abc"}}}
    status, _, payload = worker.post_json("/v1/chat/completions", {
        "messages": ASK, "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert (status, payload["error"]["param"]) == (400, "response_format"), payload
    # It ended at "regex parse error:", the reason and the pattern on the lines llguidance wrote after it.
    assert "unclosed group" in payload["error"]["message"] and "`(abc`" in payload["error"]["message"], payload


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize(
    "schema",
    [
        _nested(25),  # deeper bodies stop at the JSON parser's 64-level bound
        {"type": "string", "pattern": "(a+)+(b|c|d)*{9}" * 40},
        {"type": "string", "pattern": "a{1000}{1000}"},
        {"enum": [f"value-{i}" for i in range(4000)]},
        {"type": "object", "properties": {f"k{i}": {"type": "string", "pattern": f"[a-z]{{{i % 50}}}x"} for i in range(800)},
         "required": [f"k{i}" for i in range(800)]},
        {"anyOf": [{"type": "object", "properties": {str(i): {"type": "number"}}} for i in range(500)]},
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
    ],
    ids=["nested-25", "nested-quantifiers", "huge-repeat", "enum-4000", "800-patterns", "anyof-500", "self-ref"],
)
def test_hostile_schemas_are_served_or_refused_with_a_400_and_the_worker_stays_healthy(worker, schema):
    status, _, payload = worker.post_json("/v1/chat/completions", {
        "messages": ASK, "max_tokens": 4, "chat_template_kwargs": {"enable_thinking": False},
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert status in (200, 400), payload
    if status == 400:
        assert payload["error"]["param"] == "response_format"
    assert worker.get_json("/health")["status"] == "ok"
