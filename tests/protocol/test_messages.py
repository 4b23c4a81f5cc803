"""The Messages translation as pure functions: Claude Code's request shapes into a chat request, and
the split output into Anthropic's content blocks and stream events."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.tool_parsers import qwen3_coder

from mtpstack.worker.protocol.chat import OutputSpec, ProtocolError
from mtpstack.worker.protocol.messages import answer_options, billing_line, messages_refusal, reasoning_of, signature_of, to_chat
from mtpstack.worker.protocol.messages_answer import MessageBuilder, matched_stop, usage
from mtpstack.worker.protocol.output import Markers
from tests.anthropic_stream import replay

QWEN35 = Markers("<think>", "</think>", "<tool_call>", "</tool_call>", qwen3_coder.parse_tool_call)
BASH = {"name": "Bash", "description": "Runs a command.", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
CC = "cache_control"
#: Claude Code 2.1's first turn, as recorded (texts shortened).
CLAUDE_CODE_FIRST = {
    "model": "demo", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code."},
               {"type": "text", "text": "You are an interactive CLI tool.", CC: {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "list the files", CC: {"type": "ephemeral"}}]},
        {"role": "system", "content": [{"type": "text", "text": "<context>cwd: /tmp</context>", CC: {"type": "ephemeral"}}]},
    ],
    "tools": [BASH], "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s-1"})},
    "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
}
TOOL_TURN = [
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "", "signature": signature_of("I should run ls.")},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt", "is_error": False, CC: {"type": "ephemeral"}},
        {"type": "text", "text": "now read it"}]},
]


def test_claude_codes_first_turn_becomes_one_system_message_then_the_user_turn_with_its_context():
    chat, answer = to_chat(CLAUDE_CODE_FIRST), answer_options(CLAUDE_CODE_FIRST)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\n\nYou are an interactive CLI tool."},
        {"role": "user", "content": "list the files\n\n<context>cwd: /tmp</context>"},
    ]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "Bash", "description": "Runs a command.", "parameters": BASH["input_schema"]}}]
    # adaptive thinking is the template's own default, whatever the effort
    assert chat["max_tokens"] == 32000 and chat["stream"] is True and "reasoning_effort" not in chat
    assert "max_reasoning_tokens" not in chat and answer["display"] == "omitted"
    for ignored in ("metadata", "context_management", "thinking", "output_config", "system"):
        assert ignored not in chat


def test_the_next_turn_renders_the_same_beginning_with_the_system_message_as_a_plain_string():
    first = to_chat(CLAUDE_CODE_FIRST)
    body = dict(CLAUDE_CODE_FIRST, messages=[CLAUDE_CODE_FIRST["messages"][0],
                                             {"role": "system", "content": "<context>cwd: /tmp</context>"}, *TOOL_TURN])
    chat = to_chat(body)
    assert chat["messages"][:2] == first["messages"]


#: Claude Code 2.1.332's billing line: its default mode, and its first-party mode (a base URL it takes for
#: Anthropic's) on two requests of one conversation, as recorded through a logging relay.
BILLING_DEFAULT = "x-anthropic-billing-header: cc_version=2.1.332.9a2; cc_entrypoint=sdk-cli;"
BILLING_FIRST_PARTY = [
    "x-anthropic-billing-header: cc_version=2.1.332.9a2; cc_entrypoint=sdk-cli; cch=24d9b; "
    "cc_prompt_id=6ba199de-c82b-40ad-81e5-b4ac2c1b68e7; cc_turn_origin=sdk; cc_prompt_index=0; cc_turn_index=1;",
    "x-anthropic-billing-header: cc_version=2.1.332.9a2; cc_entrypoint=sdk-cli; cch=d6d52; "
    "cc_prompt_id=a2f66ce2-d2a1-4c3a-81aa-d6d36ccc9af3; cc_turn_origin=sdk; cc_prompt_index=0; cc_turn_index=2; "
    "cc_prev_req=req_011CVxyz; cc_prev_msg=msg_01ABC; cc_prev_prompt_index=0; cc_prev_turn_index=1;",
]


def test_the_billing_lines_per_request_fields_are_left_out_and_its_default_form_is_kept_as_sent():
    assert billing_line(BILLING_DEFAULT) == BILLING_DEFAULT
    assert [billing_line(line) for line in BILLING_FIRST_PARTY] == [BILLING_DEFAULT] * 2
    kept = BILLING_DEFAULT + " cc_workload=cron; cc_is_subagent=true; cc_gateway=env;"
    assert billing_line(kept) == kept
    # anything else is the client's text, as sent
    for text in ("You are Claude Code.", "x-anthropic-billing-header: a=1;\nnow do this", " x-anthropic-billing-header: cch=1;"):
        assert billing_line(text) == text


def test_a_first_party_conversation_renders_the_same_beginning_on_every_request():
    """Only the first system block is read so; the same line elsewhere is the client's text."""
    chats = [to_chat(dict(CLAUDE_CODE_FIRST, system=[{"type": "text", "text": line}, *CLAUDE_CODE_FIRST["system"]]))
             for line in [BILLING_DEFAULT, *BILLING_FIRST_PARTY]]
    assert chats[0]["messages"] == chats[1]["messages"] == chats[2]["messages"]
    assert chats[0]["messages"][0]["content"].startswith(BILLING_DEFAULT + "\n\nYou are Claude Code.")
    later = to_chat(dict(CLAUDE_CODE_FIRST, system=[*CLAUDE_CODE_FIRST["system"], {"type": "text", "text": BILLING_FIRST_PARTY[0]}]))
    assert later["messages"][0]["content"].endswith(BILLING_FIRST_PARTY[0])


def test_a_tool_round_trip_becomes_tool_calls_then_a_tool_message_then_the_users_text():
    chat = to_chat(dict(CLAUDE_CODE_FIRST, messages=[{"role": "user", "content": "go"}, *TOOL_TURN]))
    _, _, assistant, tool, user = chat["messages"]
    assert assistant == {"role": "assistant", "content": "", "reasoning_content": "I should run ls.",
                         "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}]}
    assert tool == {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"}
    assert user == {"role": "user", "content": "now read it"}


def test_an_error_result_says_so_and_block_content_is_joined_with_images_as_a_note():
    body = {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": True, "content": [
        {"type": "text", "text": "no such file"}, {"type": "image", "source": {"type": "base64", "data": "AA=="}}]}]}]}
    [tool] = to_chat(body)["messages"]
    assert tool["content"].startswith("Error: no such file\n\n[image omitted")


@pytest.mark.parametrize("choice, chat_choice, single", [
    ({"type": "auto"}, "auto", False), ({"type": "any"}, "required", False), ({"type": "none"}, "none", False),
    ({"type": "tool", "name": "Bash", "disable_parallel_tool_use": True}, {"type": "function", "function": {"name": "Bash"}}, True),
])
def test_tool_choice_maps_onto_chats(choice, chat_choice, single):
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [BASH], "tool_choice": choice}
    assert to_chat(body)["tool_choice"] == chat_choice and answer_options(body)["single_call"] is single


@pytest.mark.parametrize("thinking, effort, budget", [
    ({"type": "enabled", "budget_tokens": 64}, "high", 64), ({"type": "disabled"}, "none", None),
    ({"type": "adaptive"}, None, None), (None, None, None),
])
def test_thinking_maps_onto_the_reasoning_switch_and_its_budget(thinking, effort, budget):
    body = {"messages": [{"role": "user", "content": "x"}]}
    if thinking is not None:
        body["thinking"] = thinking
    chat = to_chat(body)
    assert chat.get("reasoning_effort") == effort and chat.get("max_reasoning_tokens") == budget


@pytest.mark.parametrize("display, shown", [("omitted", "omitted"), ("summarized", "summarized"), ("updates", "summarized")])
def test_thinking_is_shown_unless_its_display_is_omitted(display, shown):
    # Claude Code with `--verbose` asks `updates`: refused, it retried without `display` after two 400s.
    body = {"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "adaptive", "display": display}}
    assert answer_options(body)["display"] == shown


def test_effort_alone_turns_thinking_on_or_leaves_it_to_thinking_when_both_are_sent():
    ask = [{"role": "user", "content": "x"}]
    assert to_chat({"messages": ask, "output_config": {"effort": "max"}})["reasoning_effort"] == "xhigh"
    both = {"messages": ask, "output_config": {"effort": "low"}, "thinking": {"type": "disabled"}}
    assert to_chat(both)["reasoning_effort"] == "none"
    assert "reasoning_effort" not in to_chat({**both, "thinking": {"type": "adaptive"}})


def test_server_tools_are_dropped_and_a_choice_among_none_left_is_dropped_too():
    chat = to_chat({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "auto"},
                    "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
    assert chat["tools"] == [] and "tool_choice" not in chat


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "Bash", "input": [1]}]}]},
     "messages[0].content[0].input"),
    ({"messages": [{"role": "user", "content": "x"}], "system": [{"type": "image"}]}, "system"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "Bash"}]}, "tools[0].input_schema"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "any"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled"}}, "thinking"),
    ({"messages": [{"role": "user", "content": "x"}], "output_config": {"effort": "extreme"}}, "output_config"),
    ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": "END"}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": "x"}], "top_k": -1}, "top_k"),
])
def test_malformed_requests_are_refused_naming_the_messages_field(body, param):
    with pytest.raises(ProtocolError) as e:
        to_chat(body)
    assert e.value.param == param


def test_chat_refusals_are_renamed_to_the_field_the_client_sent():
    assert messages_refusal("messages[3].tool_calls[0].function.arguments", "m")[0] == "messages"
    assert messages_refusal("tools[0].function.parameters.required", "`tools[0].function.parameters.required` bad") == \
        ("tools[0].input_schema.required", "`tools[0].input_schema.required` bad")
    assert messages_refusal("stop", "m")[0] == "stop_sequences"


@given(st.text(max_size=400))
@settings(max_examples=60)
def test_a_signature_carries_its_reasoning_back(text):
    assert reasoning_of(signature_of(text)) == text


@pytest.mark.parametrize("signature", [None, 5, "", "EqQBCkYIBxgCKkD", "mtp1.!!!", "mtp1." + "A" * 40])
def test_a_signature_this_worker_did_not_mint_carries_nothing(signature):
    assert reasoning_of(signature) == ""


def test_a_compressed_bomb_in_a_signature_is_not_inflated():
    import base64
    import zlib
    bomb = "mtp1." + base64.urlsafe_b64encode(zlib.compress(b"a" * (4 << 20), 9)).decode()
    assert reasoning_of(bomb) == ""


ANSWER = ("Let me look.\n</think>\n\nRunning it.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls\n"
          "</parameter>\n</function>\n</tool_call>")


def stream(builder, chunks, reason="stop", stop_sequence=None):
    events = builder.start(usage(10, 0))
    for c in chunks:
        events += builder.feed(c)
    return events + builder.finish(reason, usage(10, 7, 4), stop_sequence)



@pytest.mark.parametrize("chunks", [[ANSWER], list(ANSWER), [ANSWER[:17], ANSWER[17:60], ANSWER[60:]]])
def test_a_streamed_answer_replays_to_the_whole_message_however_it_is_chunked(chunks):
    spec = OutputSpec(QWEN35, reasoning=True, tools=[{"type": "function", "function": {"name": "Bash"}}], parse_tools=True)
    streamed = MessageBuilder(spec, "demo")
    events = stream(streamed, chunks)
    whole = MessageBuilder(spec, "demo")
    whole.feed(ANSWER)
    whole.finish("stop", usage(10, 7, 4))
    msg = replay(events)
    expected = whole.message("stop", usage(10, 7, 4))
    assert [b["type"] for b in msg["content"]] == ["thinking", "text", "tool_use"]
    assert msg["content"][0]["thinking"] == "Let me look.\n" and reasoning_of(msg["content"][0]["signature"]) == "Let me look.\n"
    assert msg["content"][1] == {"type": "text", "text": "Running it."}
    call = msg["content"][2]
    assert call["id"].startswith("toolu_") and call["name"] == "Bash" and call["input"] == {"command": "ls"}
    assert msg["stop_reason"] == "tool_use" == expected["stop_reason"]
    assert msg["usage"] == {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4, "output_tokens": 7}
    strip = [{k: v for k, v in b.items() if k != "id"} for b in expected["content"]]
    assert [{k: v for k, v in b.items() if k != "id"} for b in msg["content"]] == strip
    assert events[-1] == {"type": "message_stop"}


def test_omitted_thinking_sends_the_block_without_its_text_but_with_a_signature_that_carries_it():
    spec = OutputSpec(QWEN35, reasoning=True)
    events = stream(MessageBuilder(spec, "demo", display="omitted"), ["secret plan</think>\n\nhi"])
    assert not [e for e in events if e.get("delta", {}).get("type") == "thinking_delta"]
    thinking = replay(events)["content"][0]
    assert thinking["thinking"] == "" and reasoning_of(thinking["signature"]) == "secret plan"


def test_only_the_first_call_is_kept_when_parallel_calls_are_disabled():
    spec = OutputSpec(QWEN35, tools=[], parse_tools=True)
    call = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
    msg = replay(stream(MessageBuilder(spec, "demo", single_call=True), [call + call]))
    assert [b["type"] for b in msg["content"]] == ["tool_use"]


@pytest.mark.parametrize("reason, stop_sequence, expected", [
    ("stop", None, "end_turn"), ("length", None, "max_tokens"), ("stop", "END", "stop_sequence")])
def test_stop_reasons(reason, stop_sequence, expected):
    msg = replay(stream(MessageBuilder(None, "demo"), ["hi"], reason, stop_sequence))
    assert msg["stop_reason"] == expected and msg["stop_sequence"] == stop_sequence


def test_the_stop_sequence_is_found_past_the_text_the_engine_kept():
    assert matched_stop(("END", "STOP"), "one two STOP three", "one two ") == "STOP"
    assert matched_stop(("END",), "one two", "one two") is None
