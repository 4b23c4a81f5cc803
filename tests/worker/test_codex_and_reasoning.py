"""Codex CLI's Responses requests as it sends them, and control of the reasoning, against a real worker.

The request shapes are Codex CLI 0.171's (`../shared/notes/agent-clients.md`): `stream`, `tool_choice:
auto`, `parallel_tool_calls`, `reasoning: {summary: auto}`, `store: false`, `include`,
`prompt_cache_key`, `client_metadata`, and tools of types `function`, `namespace` and `web_search`.
The tiny model's weights are random and never close a think block by themselves, which is exactly
the model a reasoning budget exists for.
"""

from __future__ import annotations

import json

import pytest

from devkit.demo.agent import build_agent_pair

SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
         "strict": False, "parameters": {"type": "object", "properties": {
             "command": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
             "workdir": {"type": "string", "maxLength": 8}}, "required": ["command"], "additionalProperties": False}}
NAMESPACE = {"type": "namespace", "name": "mcp__files", "description": "Files on the user's machine.", "tools": [
    {"type": "function", "name": "read_file", "description": "Reads a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 8}}, "required": ["path"]}}]}
CODEX_TOOLS = [SHELL, NAMESPACE, {"type": "web_search"}]
CODEX = {
    "instructions": "You are Codex, a coding agent.",
    "tools": CODEX_TOOLS, "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
    "store": False, "stream": True, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "019ad0f2-5c1e",
}
CODEX_EXTRA = {"client_metadata": {"originator": "codex_exec"}}
USER = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>none</permissions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def worker(tmp_path_factory, live_worker_class):
    pair = build_agent_pair(tmp_path_factory.mktemp("agent"), seed=0)
    with live_worker_class(tmp_path_factory.mktemp("codexw"), *pair, depth=2, width=2) as w:
        yield w


def final_response(stream):
    types, final = [], None
    for event in stream:
        types.append(event.type)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert types[0] == "response.created" and final is not None, types
    return final


def test_codex_first_turn_is_served(client):
    final = final_response(client.responses.create(model="tiny", input=USER, max_output_tokens=24, **CODEX,
                                                   extra_body=CODEX_EXTRA))
    assert final.status in ("completed", "incomplete") and final.output


def test_a_namespaced_function_is_called_by_its_name_and_says_its_namespace(client):
    body = dict(CODEX, tool_choice={"type": "function", "name": "read_file"})
    final = final_response(client.responses.create(model="tiny", input=USER, max_output_tokens=80, **body,
                                                   extra_body=CODEX_EXTRA))
    [call] = [i for i in final.output if i.type == "function_call"]
    assert call.name == "read_file" and getattr(call, "namespace", None) == "mcp__files"
    assert set(json.loads(call.arguments)) == {"path"}


def test_codex_next_turn_with_its_history_items_is_served(client):
    history = USER + [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
        {"type": "function_call", "name": "shell", "arguments": json.dumps({"command": ["ls"]}), "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nb.txt\n"},
        {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "weather"}},
    ]
    final = final_response(client.responses.create(model="tiny", input=history, max_output_tokens=16, **CODEX,
                                                   extra_body=CODEX_EXTRA))
    assert final.status in ("completed", "incomplete")


def test_unknown_fields_and_hosted_tools_are_ignored_and_logged_once(worker, client):
    for _ in range(2):
        status, _, body = worker.post_json("/v1/responses", {
            "input": "hi", "max_output_tokens": 4, "frobnicate_v9": {"a": 1}, "tools": [{"type": "file_search"}]})
        assert status == 200, body
    log = worker.proc.log_path.read_text()
    assert log.count("field `frobnicate_v9` is accepted and ignored") == 1
    assert log.count("`file_search` tools are dropped") == 1


def test_reasoning_effort_none_turns_thinking_off(client):
    on = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=8, temperature=0)
    off = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=8, temperature=0, reasoning_effort="none")
    assert getattr(on.choices[0].message, "reasoning", None)  # the template opened <think>: all of it is reasoning
    assert not getattr(off.choices[0].message, "reasoning", None) and off.choices[0].message.content
    assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the closed think block is in the prompt


def test_responses_reasoning_effort_minimal_turns_thinking_off(client):
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=8, reasoning={"effort": "minimal"})
    assert [i.type for i in r.output] == ["message"]


@pytest.mark.parametrize("budget", [0, 5])
def test_a_reasoning_budget_closes_the_block_after_that_many_tokens(client, budget):
    r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=20, temperature=0, logprobs=True,
                                       extra_body={"max_reasoning_tokens": budget, "num_draft_tokens": 2})
    tokens = [e.token for e in r.choices[0].logprobs.content]
    assert tokens.index("</think>") == budget, tokens
    assert r.choices[0].message.content


def test_a_forced_call_completes_with_thinking_on_and_no_reasoning_setting(client):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required",
                                       max_tokens=120, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls", r
    [call] = r.choices[0].message.tool_calls
    assert set(json.loads(call.function.arguments)) == {"city"}
    assert r.choices[0].message.reasoning  # the reasoning was kept, only cut at half of max_tokens


def test_a_json_schema_answer_parses_with_thinking_on(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["n", "ok"]}
    r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=80, temperature=0,
                                       response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert set(json.loads(r.choices[0].message.content)) == {"n", "ok"}


@pytest.mark.parametrize(("body", "param"), [
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"max_reasoning_tokens": -1}, "max_reasoning_tokens"),
    ({"max_reasoning_tokens": True}, "max_reasoning_tokens"),
])
def test_reasoning_settings_are_checked(worker, body, param):
    status, _, payload = worker.post_json("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **body})
    assert (status, payload["error"]["param"]) == (400, param), payload
