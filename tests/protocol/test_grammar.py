"""Grammars and the constraint hook on a real tokenizer: masks per verified position, drafts cut at the first rejected token."""

from __future__ import annotations

import json
from functools import partial

import mlx.core as mx
import pytest
from mlx_lm.utils import load_tokenizer

from devkit.demo.agent import build_agent_tokenizer
from mtpstack.worker.protocol.grammar import (CACHED_KEY_CHARS, MAX_SCHEMA_BYTES, GrammarError, Grammars, json_grammar,
                                              tool_grammar)
from mtpstack.worker.protocol.hooks import Constraint

TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}, "s": {"type": "string", "maxLength": 4}}, "required": ["x"]}}}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    vocab = build_agent_tokenizer(d)
    return load_tokenizer(d), vocab


def constraint(tok, grammar, **kw):
    tokenizer, vocab = tok
    return Constraint(Grammars(tokenizer, vocab).matcher(grammar), vocab, **kw)


def test_a_draft_is_cut_at_its_first_token_the_grammar_rejects_and_the_matcher_is_left_unchanged(tok):
    tokenizer, vocab = tok
    c = constraint(tok, json_grammar({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    good = tokenizer.encode('{"a":', add_special_tokens=False)
    bad = tokenizer.encode("x", add_special_tokens=False)
    drafted = good + bad + good
    logits = mx.zeros((len(drafted) + 1, vocab))
    masked = c.mask(logits, drafted)
    finite = [{i for i, v in enumerate(mx.isfinite(masked[j]).tolist()) if v} for j in range(len(drafted) + 1)]
    for j, t in enumerate(good):
        assert t in finite[j] and len(finite[j]) < vocab
    assert bad[0] not in finite[len(good)]  # the cut: the target cannot confirm this token
    assert all(len(f) == vocab for f in finite[len(good) + 1:])  # past the cut: never emitted, left alone
    assert c.mask(logits, drafted).tolist() == masked.tolist()  # mask() consumed nothing


def test_the_constraint_starts_where_the_reasoning_ends(tok):
    tokenizer, vocab = tok
    end = tokenizer.encode("</think>", add_special_tokens=False)
    [end_id] = end
    c = constraint(tok, json_grammar(None), think_end_id=end_id, reasoning=True)
    words = tokenizer.encode("hello", add_special_tokens=False)
    rows = c.mask(mx.zeros((len(words) + 2, vocab)), words + [end_id])
    finite = [int(mx.isfinite(rows[j]).sum().item()) for j in range(len(words) + 2)]
    assert finite[:-1] == [vocab] * (len(words) + 1) and finite[-1] < vocab
    c.advance(words + [end_id])
    assert not c.reasoning


def test_while_the_reasoning_lasts_the_turn_cannot_end_before_the_forced_structure(tok):
    """A model that ends its turns would otherwise end one inside its reasoning, and a forced call or
    schema would never get its turn: the end ids are masked until `</think>`, and a draft that
    writes one there is cut at it."""
    tokenizer, vocab = tok
    [end_id] = tokenizer.encode("</think>", add_special_tokens=False)
    [im_end] = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    c = constraint(tok, json_grammar(None), think_end_id=end_id, reasoning=True, end_ids=(im_end, end_id))
    assert c.end_ids == (im_end,)  # the reasoning's own end stays allowed
    words = tokenizer.encode("hello", add_special_tokens=False)
    rows = c.mask(mx.zeros((len(words) + 2, vocab)), words + [im_end])
    finite = [mx.isfinite(rows[j]).tolist() for j in range(len(words) + 2)]
    assert all(not f[im_end] and f[end_id] and sum(f) == vocab - 1 for f in finite[: len(words) + 1])
    assert all(finite[-1])  # past the cut: never emitted, left alone
    rows = c.mask(mx.zeros((len(words) + 2, vocab)), words + [end_id])
    assert 0 < int(mx.isfinite(rows[-1]).sum().item()) < vocab  # after `</think>`: the grammar's own mask


@pytest.mark.parametrize("fmt", ["qwen3_coder", "json_tools"])
def test_a_forced_call_accepts_a_valid_call_and_nothing_else(tok, fmt):
    tokenizer, _ = tok
    if fmt == "qwen3_coder":
        good = "<tool_call>\n<function=f>\n<parameter=x>\n7\n</parameter>\n<parameter=s>\nab\n</parameter>\n</function>\n</tool_call>"
        bad = "<tool_call>\n<function=f>\n<parameter=x>\nseven\n</parameter>\n</function>\n</tool_call>"
    else:
        good = '<tool_call>\n{"name": "f", "arguments": {"x":7}}\n</tool_call>'
        bad = '<tool_call>\n{"name": "g", "arguments": {"x":7}}\n</tool_call>'
    for text, ok in ((good, True), (bad, False)):
        m = Grammars(tokenizer, tok[1]).matcher(tool_grammar([TOOL], fmt))
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert (m.try_consume_tokens(ids) == len(ids) and m.is_accepting()) is ok, text


def test_schemas_past_the_size_bound_or_invalid_are_refused_with_a_reason(tok):
    big = {"type": "object", "description": "x" * MAX_SCHEMA_BYTES}
    with pytest.raises(GrammarError, match="larger than the limit"):
        json_grammar(big)
    with pytest.raises(GrammarError):
        Grammars(tok[0], tok[1]).matcher(json_grammar({"type": "frob"}))
    with pytest.raises(GrammarError, match="cannot be forced"):
        tool_grammar([TOOL], "mistral")
    assert json.loads(json.dumps(TOOL))  # the fixture itself is plain JSON


@pytest.mark.parametrize("required", ["x", [{"a": 1}], [1]])
def test_a_forced_call_whose_required_is_not_a_list_of_names_is_refused(required):
    tool = {"type": "function", "function": {"name": "f", "parameters": {**TOOL["function"]["parameters"], "required": required}}}
    with pytest.raises(GrammarError, match="`required` list of strings"):
        tool_grammar([tool], "qwen3_coder")


def test_a_grammar_is_compiled_once_and_each_request_gets_its_own_matcher(tok):
    tokenizer, _ = tok
    grammars = Grammars(tokenizer, tok[1])
    grammar = tool_grammar([TOOL], "qwen3_coder")
    first, second = grammars.matcher(grammar), grammars.matcher(grammar)
    assert grammars.cached == 1  # the second came from the cache
    ids = tokenizer.encode("<tool_call>\n<function=f>\n", add_special_tokens=False)
    assert first.try_consume_tokens(ids) == len(ids)
    assert second.try_consume_tokens(ids) == len(ids)  # the copies do not share state
    with pytest.raises(GrammarError):
        grammars.matcher(json_grammar({"type": "frob"}))
    with pytest.raises(GrammarError):  # a refusal is remembered as well
        grammars.matcher(json_grammar({"type": "frob"}))
    assert grammars.cached == 2


def test_the_grammar_cache_is_bounded(tok):
    grammars = Grammars(tok[0], tok[1], cache_size=3)
    for i in range(5):
        grammars.matcher(json_grammar({"type": "string", "maxLength": i + 1}))
    assert grammars.cached == 3


async def test_a_compile_past_its_deadline_is_refused_naming_the_deadline(tok):
    grammars = Grammars(tok[0], tok[1])
    schema = {"anyOf": [{"type": "integer", "minimum": i * 7 + 1, "maximum": 10**9 - i * 13} for i in range(700)]}
    with pytest.raises(GrammarError, match=r"did not compile within 0\.001 s"):
        await grammars.compile(json_grammar(schema), seconds=0.001)
    assert (await grammars.compile(json_grammar({"type": "integer"}))).is_accepting() is False


def test_a_reasoning_budget_forces_the_end_marker_and_cuts_a_draft_that_runs_past_it():
    from mtpstack.worker.protocol.hooks import ThinkBudget

    vocab, end = 16, 7
    b = ThinkBudget(end, 2)
    logits = mx.zeros((4, vocab))
    rows = b.mask(logits, [1, 2, 3])  # positions 0, 1 free; 2 forced; the draft's 3 past it is cut
    finite = [int(mx.isfinite(rows[j]).sum().item()) for j in range(4)]
    assert finite[:3] == [vocab, vocab, 1] and bool(mx.isfinite(rows[2, end]).item())
    assert finite[3] == vocab  # never emitted: left alone
    rows = b.mask(logits, [1, end, 3])  # the draft closes the block itself: nothing is forced
    assert int(mx.isfinite(rows).sum().item()) == 4 * vocab
    b.advance([1, 2])
    assert b.used == 2 and b.reasoning
    assert int(mx.isfinite(b.mask(mx.zeros((1, vocab)), [])[0]).sum().item()) == 1
    b.advance([end, 5])
    assert not b.reasoning and b.mask(logits, [1]) is logits


async def test_an_oversized_schema_is_refused_without_being_kept_in_the_cache(tok):
    grammars = Grammars(tok[0], tok[1])
    huge = {"type": "object", "description": "x" * CACHED_KEY_CHARS}  # a client's megabytes: not kept
    with pytest.raises(GrammarError, match="larger than the limit"):
        await grammars.compile(partial(json_grammar, huge))
    assert grammars.cached == 0
    assert (await grammars.compile(partial(json_grammar, {"type": "object"}))).is_error() is False
    assert grammars.cached == 1
