"""OpenAI's structured-output semantics: objects closed, unbounded values bounded, on a real tokenizer's matcher."""

from __future__ import annotations

import json

import pytest
from mlx_lm.utils import load_tokenizer

from devkit.demo.agent import build_agent_tokenizer
from mtpstack.worker.protocol.grammar import Grammars, json_grammar, tool_grammar
from mtpstack.worker.protocol.schema import MAX_INTEGER, MAX_STRING_CHARS, bounded


@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    vocab = build_agent_tokenizer(d)
    tokenizer = load_tokenizer(d)
    return tokenizer, Grammars(tokenizer, vocab)


def accepts(grammars, grammar: str, text: str) -> bool:
    """Whether the whole of `text` is a complete sentence of `grammar`."""
    tokenizer, g = grammars
    m = g.matcher(grammar)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


OPEN = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}, "required": ["city", "n"]}


def test_a_schema_without_additional_properties_is_closed_as_openai_reads_it(grammars):
    g = json_grammar(OPEN)
    assert accepts(grammars, g, '{"city":"Oslo","n":3}')
    assert not accepts(grammars, g, '{"city":"Oslo","n":3,"extra":1}')


def test_nested_objects_are_closed_too_and_an_explicit_choice_is_kept():
    schema = {"type": "object", "properties": {"inner": {"type": "object", "properties": {"a": {"type": "string"}}},
                                               "free": {"type": "object", "additionalProperties": True}},
              "$defs": {"d": {"properties": {"b": {"type": "integer"}}}}}
    out = bounded(schema, closed=True)
    assert out["additionalProperties"] is False
    assert out["properties"]["inner"]["additionalProperties"] is False
    assert out["properties"]["free"]["additionalProperties"] is True
    assert out["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the client's schema is not changed
    assert "additionalProperties" not in bounded(schema, closed=False)


def test_an_unbounded_integer_ends_within_18_digits(grammars):
    g = json_grammar(OPEN)
    assert accepts(grammars, g, '{"city":"a","n":' + "9" * 18 + "}")
    assert not accepts(grammars, g, '{"city":"a","n":' + "1" * 19 + "}")
    assert accepts(grammars, g, '{"city":"a","n":-' + "9" * 18 + "}")


def test_an_unbounded_number_has_at_most_9_decimals_and_no_runaway_integer_part(grammars):
    g = json_grammar({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]})
    assert accepts(grammars, g, '{"x":3.141592653}')
    assert not accepts(grammars, g, '{"x":3.1415926535}')
    assert accepts(grammars, g, '{"x":-12.5}')
    assert not accepts(grammars, g, '{"x":' + "1" * 17 + "}")


def test_a_bound_the_client_sets_is_kept():
    out = bounded({"type": "integer", "minimum": 0}, closed=True)
    assert out["minimum"] == 0 and out["maximum"] == MAX_INTEGER
    out = bounded({"type": "integer", "minimum": 10**20}, closed=True)
    assert "maximum" not in out  # the client's own range is not emptied
    assert bounded({"type": "string", "maxLength": 3}, closed=True)["maxLength"] == 3
    assert "maxLength" not in bounded({"type": "string", "enum": ["a", "b"]}, closed=True)


def test_an_unbounded_string_ends(grammars):
    g = json_grammar({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]})
    assert accepts(grammars, g, json.dumps({"s": "x" * MAX_STRING_CHARS}, separators=(",", ":")))
    assert not accepts(grammars, g, json.dumps({"s": "x" * (MAX_STRING_CHARS + 1)}, separators=(",", ":")))


def test_a_forced_call_takes_only_declared_keys_unless_its_schema_allows_more(grammars):
    params = {"type": "object", "properties": {"opts": {"type": "object", "properties": {"a": {"type": "integer"}}}},
              "required": ["opts"]}
    open_params = {**params, "properties": {"opts": {**params["properties"]["opts"], "additionalProperties": True}}}
    call = '<tool_call>\n{"name": "f", "arguments": {"opts":{"a":1,"b":2}}}\n</tool_call>'
    for strict in (True, False):
        closed = tool_grammar([{"type": "function", "function": {"name": "f", "parameters": params, "strict": strict}}], "json_tools")
        assert not accepts(grammars, closed, call)
        assert accepts(grammars, closed, call.replace(',"b":2', ""))
    loose = tool_grammar([{"type": "function", "function": {"name": "f", "parameters": open_params}}], "json_tools")
    assert accepts(grammars, loose, call)


def test_an_xml_string_parameter_ends(grammars):
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}}}
    g = tool_grammar([tool], "qwen3_coder")
    head, tail = "<tool_call>\n<function=f>\n<parameter=s>\n", "\n</parameter>\n</function>\n</tool_call>"
    assert accepts(grammars, g, head + "y" * MAX_STRING_CHARS + tail)
    assert not accepts(grammars, g, head + "y" * (MAX_STRING_CHARS + 1) + tail)
