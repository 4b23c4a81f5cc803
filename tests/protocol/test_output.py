"""The output splitter as a pure function on crafted model text, for each tool-call format."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.tool_parsers import json_tools, qwen3_coder

from mtpstack.worker.protocol.output import Markers, OutputSplitter, assemble

QWEN35 = Markers("<think>", "</think>", "<tool_call>", "</tool_call>", qwen3_coder.parse_tool_call)
QWEN3_JSON = Markers("<think>", "</think>", "<tool_call>", "</tool_call>", json_tools.parse_tool_call)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]

XML_ANSWER = (
    "The user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
JSON_ANSWER = (
    'thinking</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'
)


def split(markers, text, chunks=None, **kw):
    s = OutputSplitter(markers, **kw)
    pieces = []
    for c in chunks or [text]:
        pieces += s.feed(c)
    return assemble(pieces + s.finish())


def test_qwen35_xml_call_becomes_a_tool_call_with_typed_arguments_and_no_markup_in_content():
    msg = split(QWEN35, XML_ANSWER, reasoning=True, tools=TOOLS)
    assert msg["reasoning"] == "The user wants weather.\n"
    assert msg["content"] == "Let me check."
    [call] = msg["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}


def test_json_tool_call_blocks_become_one_call_each_in_order():
    msg = split(QWEN3_JSON, JSON_ANSWER, reasoning=True)
    assert msg["reasoning"] == "thinking" and msg["content"] == ""
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [{"city": "Oslo"}, {"city": "Rome", "days": 2}]
    assert [c["index"] for c in msg["tool_calls"]] == [0, 1]


def test_a_prompt_that_does_not_end_inside_think_starts_in_content():
    msg = split(QWEN35, "plain answer", reasoning=False)
    assert msg == {"content": "plain answer", "reasoning": "", "tool_calls": []}


def test_a_call_cut_short_is_returned_as_content_not_dropped():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    msg = split(QWEN35, text)
    assert msg["tool_calls"] == [] and msg["content"] == text


def test_tool_choice_none_leaves_call_markup_as_content():
    msg = split(QWEN35, "</think>" + XML_ANSWER.split("</think>")[1], reasoning=True, parse_tools=False)
    assert msg["tool_calls"] == [] and msg["content"].startswith("Let me check.\n<tool_call>")


def test_a_model_that_opens_think_itself_has_that_text_as_reasoning():
    msg = split(QWEN35, "<think>hmm</think>\n\nyes")
    assert msg == {"content": "yes", "reasoning": "hmm", "tool_calls": []}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(XML_ANSWER) - 1), max_size=12), st.sampled_from([XML_ANSWER, JSON_ANSWER]))
def test_any_chunking_gives_the_same_split_as_the_whole_text(cuts, text):
    bounds = sorted(set(c for c in cuts if c < len(text)))
    chunks = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    markers = QWEN35 if text is XML_ANSWER else QWEN3_JSON
    whole, streamed = split(markers, text, reasoning=True), split(markers, text, chunks, reasoning=True)
    for m in (whole, streamed):
        for c in m["tool_calls"]:
            c.pop("id")
    assert streamed == whole


@pytest.mark.parametrize("text", ["a <tool", "a </thi", "<"])
def test_a_partial_marker_at_the_end_is_text_after_all(text):
    assert split(QWEN35, text)["content"] == text
