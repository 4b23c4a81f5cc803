"""Grammars for constrained decoding with llguidance: `response_format` and forced tool calls.

Compiled on the event loop while the request is parsed, so a bad or oversized schema is a 400
naming the field before anything reaches the generation thread. A compiled grammar becomes an
`llguidance.LLMatcher`, which `mtpstack.worker.protocol.hooks.Constraint` advances in that thread.

Bounds on client grammars: the schema's JSON text is at most `MAX_SCHEMA_BYTES`, and compiling
runs under `LIMITS` (llguidance's fuel counters, deterministic, not wall time), so a hostile schema
costs a bounded amount of work and gets a 400 past the bound.
"""

from __future__ import annotations

import json
import threading

import llguidance
import llguidance.hf

#: A schema larger than this is refused: real response schemas and tool signatures are a few KB.
MAX_SCHEMA_BYTES = 64 * 1024
#: llguidance's work bounds for compiling and per-token masking (its defaults are 1e6 lexer fuel
#: and 500k grammar symbols; a quarter keeps a worst-case compile in the tens of milliseconds).
LIMITS_KW = dict(initial_lexer_fuel=250_000, max_grammar_size=100_000, step_lexer_fuel=200_000)
#: JSON is written compact: a random or confused model cannot spin in whitespace forever.
JSON_OPTIONS = {"whitespace_flexible": False}
#: A string parameter's value in the XML call form: one line, no `<` (the closing tag must stay
#: unambiguous to llguidance's greedy lexer), within the schema's `minLength`/`maxLength`.
XML_STRING_CHARS = r"[^<\n]"


class GrammarError(ValueError):
    """A client's schema or tool signature that cannot be compiled; the message names what is wrong."""


def _limits():
    return llguidance.LLParserLimits(**LIMITS_KW)


def _schema_text(schema, what: str) -> str:
    if not isinstance(schema, dict):
        raise GrammarError(f"{what} must be a JSON object")
    text = json.dumps(schema, ensure_ascii=False)
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise GrammarError(f"{what} is larger than the limit: {MAX_SCHEMA_BYTES} bytes")
    return text


def json_grammar(schema: dict | None) -> str:
    """`response_format` `json_object` (schema None: any object) or `json_schema`."""
    text = _schema_text({"type": "object"} if schema is None else schema, "the JSON schema")
    return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)


def _lit(text: str) -> str:
    return json.dumps(text)


def _xml_call(name: str, params: dict, idx: int) -> tuple[str, list[str]]:
    """One function in the `qwen3_coder` XML form: required parameters first, in schema order, then optional ones."""
    props = params.get("properties") or {}
    if not isinstance(props, dict):
        raise GrammarError(f"the parameters of tool `{name}` must have an object `properties`")
    required = [p for p in params.get("required") or [] if p in props]
    rules, parts = [], []
    for j, pname in enumerate([*required, *[p for p in props if p not in required]]):
        if not isinstance(pname, str) or not pname or any(c in pname for c in "<>\n"):
            raise GrammarError(f"tool `{name}` has a parameter name that cannot be written in a call: {pname!r}")
        pschema = props[pname] if isinstance(props[pname], dict) else {}
        value = f"v{idx}_{j}"
        if pschema.get("type") == "string" and isinstance(pschema.get("enum"), list):
            rules.append(f"{value}: " + " | ".join(_lit(str(v)) for v in pschema["enum"]))
        elif pschema.get("type") == "string" or not pschema:
            rules.append(f"{value}: {_xml_string(pschema)}")
        else:
            rules.append(f"{value}: %json {_schema_text(pschema, f'the schema of parameter `{pname}` of tool `{name}`')}")
        rule = f"p{idx}_{j}"
        rules.append(f"{rule}: {_lit(f'<parameter={pname}>' + chr(10))} {value} {_lit(chr(10) + '</parameter>' + chr(10))}")
        parts.append(rule if pname in required else f"{rule}?")
    head = _lit(f"\n<function={name}>\n")
    return f"{head} {' '.join(parts)} {_lit('</function>' + chr(10))}", rules


def _xml_string(schema: dict) -> str:
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    lo = lo if isinstance(lo, int) and not isinstance(lo, bool) and lo > 0 else 1
    if isinstance(hi, int) and not isinstance(hi, bool) and hi >= lo:
        return f"/{XML_STRING_CHARS}{{{lo},{hi}}}/"
    return f"/{XML_STRING_CHARS}{{{lo},}}/"


def tool_grammar(tools: list[dict], fmt: str) -> str:
    """Exactly one call to one of `tools`, in the model's format (`qwen3_coder` XML or `json_tools`)."""
    alts, rules = [], []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        name, params = fn["name"], fn.get("parameters") or {"type": "object", "properties": {}}
        if any(c in name for c in "<>\n\""):
            raise GrammarError(f"tool name cannot be written in a call: {name!r}")
        if fmt == "qwen3_coder":
            body, extra = _xml_call(name, params, i)
            rules += extra
        elif fmt == "json_tools":
            opening = _lit("\n" + '{"name": "' + name + '", "arguments": ')
            body = f"{opening} a{i} {_lit(chr(125) + chr(10))}"
            rules.append(f"a{i}: %json {_schema_text(params, f'the parameters of tool `{name}`')}")
        else:
            raise GrammarError(f"a call cannot be forced for this model's tool-call format: `{fmt}`")
        alts.append(f"call{i}")
        rules.append(f"call{i}: {body}")
    lark = "\n".join([f"start: <tool_call> ({' | '.join(alts)}) </tool_call>", *rules])
    return llguidance.LLMatcher.grammar_from_lark(lark)


class Grammars:
    """One engine's llguidance tokenizer (built once, on first use: ~1 s for a 150k vocabulary)."""

    def __init__(self, tokenizer, vocab_size: int):
        self._hf = tokenizer._tokenizer
        self._vocab = vocab_size
        self._eos = sorted(tokenizer.eos_token_ids)
        self._lock = threading.Lock()
        self._lltok = None

    @property
    def lltokenizer(self):
        with self._lock:
            if self._lltok is None:
                self._lltok = llguidance.hf.from_tokenizer(self._hf, n_vocab=self._vocab, eos_token=self._eos[0])
            return self._lltok

    def matcher(self, grammar: str) -> "llguidance.LLMatcher":
        tok = self.lltokenizer
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tok, limits=_limits())
        if is_error:
            raise GrammarError(messages[0].strip().splitlines()[0][:300])
        m = llguidance.LLMatcher(tok, grammar, log_level=0, limits=_limits())
        if m.is_error():
            raise GrammarError(m.get_error().strip().splitlines()[0][:300])
        return m
