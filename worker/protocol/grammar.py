"""Grammars for constrained decoding with llguidance: `response_format` and forced tool calls.

Built and compiled after the request is parsed, before it takes a sequence slot, so a bad or
oversized schema is a 400 naming the field. Both run on compile threads, never on the event loop
(building a 40 KB schema's grammar took 6-12 ms of the loop, compiling it hundreds): llguidance
releases the GIL while it compiles (measured: the loop kept its 1 ms ticks through 0.5 s of
compiles), so a hostile schema delays neither `/health` nor another request's tokens. The threads
take grammars in turn across clients, from bounded lines (`mtpstack.worker.protocol.compile_queue`);
one that cannot start in time is refused as the worker being busy, never as the schema's fault.
A compiled grammar becomes an `llguidance.LLMatcher`, which
`mtpstack.worker.protocol.hooks.Constraint` advances in the generation thread.

Bounds on client grammars: the schema's JSON text is at most `MAX_SCHEMA_BYTES`; compiling runs
under `LIMITS_KW` (llguidance's fuel counters, deterministic, not wall time) and within
`COMPILE_SECONDS` of wall time from the moment it starts; each is a 400 past its bound. Waiting for
a thread: at most `COMPILE_START_SECONDS`, `COMPILE_WAITING_PER_CLIENT` of one client and
`COMPILE_WAITING` in all; past those, a 503 or 429 saying the worker is busy. Compiled grammars are
kept by what they are built from (`CACHED_GRAMMARS` of them) and looked up on the event loop, so an
agent resending its tools every turn compiles them once and never waits behind uncompiled ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections import OrderedDict
from functools import partial
from typing import Callable

import llguidance
import llguidance.hf

from mtpstack.worker.protocol.compile_queue import Busy, CompileQueue
from mtpstack.worker.protocol.schema import MAX_STRING_CHARS, bounded

__all__ = ["Busy", "GrammarError", "Grammars", "json_grammar", "source_key", "tool_grammar"]

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
#: Threads compiling grammars: two keep one hostile schema from queueing every other request's.
COMPILE_THREADS = 2
#: Their scheduling priority below the generation thread's (a nice value): on 2 cores, two
#: compiles at the same priority took the CPU from the generation thread and stretched another
#: stream's gaps between chunks to 0.85 s; compiling may wait, tokens should not.
COMPILE_NICENESS = 10
#: A grammar not compiled within this long of starting is refused: fuel bounds the work of one
#: compile (tenths of a second on a busy 2-core machine), this bounds its wall time when the
#: machine is starved. Its wait for a thread does not count: that is the worker's load, not the schema.
COMPILE_SECONDS = 5.0
#: A grammar that has not started compiling this long after it arrived is refused as the worker
#: being busy (503, `Retry-After`): the bound on what a client waits in line.
COMPILE_START_SECONDS = 5.0
#: Grammars of one client (its address) waiting for a thread at most; more at once is a 429. Twice
#: the widest batch (4): behind the proxy, which sends a worker at most its batch width at once, it
#: is never reached; a direct client flooding the worker is refused at once instead of filling the line.
COMPILE_WAITING_PER_CLIENT = 8
#: Grammars waiting for a thread, all clients together; more is a 503. With a compile taking up to
#: a few tenths of a second, the last of them starts within `COMPILE_START_SECONDS`.
COMPILE_WAITING = 32
#: Compiled grammars (and refusals) kept per tokenizer, least recently used dropped first.
CACHED_GRAMMARS = 64
#: A grammar whose key (its text, or what it is built from) is longer is compiled each time it is
#: asked for, not kept: the cache holds at most 64 of these, 16 MiB (a schema may be 64 KiB; tool
#: sets of tens of KB are what agents resend), whatever size of body a client sends.
CACHED_KEY_CHARS = 4 * MAX_SCHEMA_BYTES


class GrammarError(ValueError):
    """A client's schema or tool signature that cannot be compiled; the message names what is wrong."""


def _limits():
    return llguidance.LLParserLimits(**LIMITS_KW)


def _schema_text(schema, what: str, limit: int = MAX_SCHEMA_BYTES) -> str:
    if not isinstance(schema, dict):
        raise GrammarError(f"{what} must be a JSON object")
    text = json.dumps(schema, ensure_ascii=False)
    if len(text.encode()) > limit:
        raise GrammarError(f"{what} is larger than the limit: {MAX_SCHEMA_BYTES} bytes")
    return text


def json_grammar(schema: dict | None, max_string: int = MAX_STRING_CHARS) -> str:
    """`response_format` `json_object` (schema None: any object) or `json_schema`, whose objects are
    closed and values bounded as OpenAI's structured outputs read a schema (`schema.bounded`)."""
    if schema is not None:
        _schema_text(schema, "the JSON schema")  # the client's size bound, before the rewrite adds keys
        schema = bounded(schema, closed=True, max_string=max_string)
    text = _schema_text({"type": "object"} if schema is None else schema, "the JSON schema", MAX_SCHEMA_BYTES * 2)
    return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)


def source_key(make: partial) -> str:
    """What a grammar builder (`partial(json_grammar, schema)`, `partial(tool_grammar, tools, fmt)`, with
    its string bound) builds from, as text: how a compiled grammar is found without building it again."""
    return json.dumps([make.func.__name__, *make.args, make.keywords], sort_keys=True, default=str)


def _lit(text: str) -> str:
    return json.dumps(text)


def _reason(text: str) -> str:
    """llguidance's error as one line. A regex error spans three (the head, the pattern with a caret
    under the fault, `error: ...`): kept as the head, the reason and the pattern."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    if len(lines) > 2 and lines[0].endswith(":"):
        reason = lines[-1].removeprefix("error:").strip()
        return f"{lines[0][:-1]}: {reason} in `{lines[1][:200]}`"
    return lines[0][:300]


def _xml_call(name: str, params: dict, idx: int, max_string: int) -> tuple[str, list[str]]:
    """One function in the `qwen3_coder` XML form: required parameters first, in schema order, then optional ones."""
    props = params.get("properties") or {}
    if not isinstance(props, dict):
        raise GrammarError(f"the parameters of tool `{name}` must have an object `properties`")
    required = params.get("required") or []
    if not isinstance(required, list) or not all(isinstance(p, str) for p in required):
        raise GrammarError(f"the parameters of tool `{name}` must have a `required` list of strings")
    required = [p for p in dict.fromkeys(required) if p in props]
    rules, parts = [], []
    for j, pname in enumerate([*required, *[p for p in props if p not in required]]):
        if not isinstance(pname, str) or not pname or any(c in pname for c in "<>\n"):
            raise GrammarError(f"tool `{name}` has a parameter name that cannot be written in a call: {pname!r}")
        pschema = props[pname] if isinstance(props[pname], dict) else {}
        value = f"v{idx}_{j}"
        if pschema.get("type") == "string" and isinstance(pschema.get("enum"), list):
            rules.append(f"{value}: " + " | ".join(_lit(str(v)) for v in pschema["enum"]))
        elif pschema.get("type") == "string" or not pschema:
            rules.append(f"{value}: {_xml_string(pschema, max_string)}")
        else:
            rules.append(f"{value}: %json {_param_schema(pschema, max_string, f'the schema of parameter `{pname}` of tool `{name}`')}")
        rule = f"p{idx}_{j}"
        rules.append(f"{rule}: {_lit(f'<parameter={pname}>' + chr(10))} {value} {_lit(chr(10) + '</parameter>' + chr(10))}")
        parts.append(rule if pname in required else f"{rule}?")
    head = _lit(f"\n<function={name}>\n")
    return f"{head} {' '.join(parts)} {_lit('</function>' + chr(10))}", rules


def _param_schema(schema: dict, max_string: int, what: str) -> str:
    """A parameter's (or a whole call's) schema for `%json`: the client's size bound, then closed and
    bounded, and compact as `json_grammar` writes it (`JSON_OPTIONS`)."""
    _schema_text(schema, what)
    return _schema_text({**bounded(schema, closed=True, max_string=max_string), "x-guidance": JSON_OPTIONS}, what, MAX_SCHEMA_BYTES * 2)


def _xml_string(schema: dict, max_string: int) -> str:
    """A string value in the XML form: within `minLength`/`maxLength`, at most `max_string`
    characters when the schema sets no `maxLength` (so a value always ends)."""
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    lo = lo if isinstance(lo, int) and not isinstance(lo, bool) and lo > 0 else 1
    hi = hi if isinstance(hi, int) and not isinstance(hi, bool) and hi >= lo else max(lo, max_string)
    return f"/{XML_STRING_CHARS}{{{lo},{hi}}}/"


def tool_grammar(tools: list[dict], fmt: str, max_string: int = MAX_STRING_CHARS) -> str:
    """Exactly one call to one of `tools`, in the model's format (`qwen3_coder` XML or `json_tools`), or
    in the generic format for a template that has none (`generic`: the same JSON between text markers).
    Every forced call has OpenAI's strict semantics, `strict: true` or not: only declared keys where the
    schema does not allow more (the XML form can write no other parameter anyway), bounded values."""
    alts, rules = [], []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        name, params = fn["name"], fn.get("parameters") or {"type": "object", "properties": {}}
        if any(c in name for c in "<>\n\""):
            raise GrammarError(f"tool name cannot be written in a call: {name!r}")
        if fmt == "qwen3_coder":
            body, extra = _xml_call(name, params, i, max_string)
            rules += extra
        elif fmt in ("json_tools", "generic"):
            opening = _lit("\n" + '{"name": "' + name + '", "arguments": ')
            body = f"{opening} a{i} {_lit(chr(125) + chr(10))}"
            rules.append(f"a{i}: %json {_param_schema(params, max_string, f'the parameters of tool `{name}`')}")
        else:
            raise GrammarError(f"a call cannot be forced for this model's tool-call format: `{fmt}`")
        alts.append(f"call{i}")
        rules.append(f"call{i}: {body}")
    # The generic format's markers are text (`mtpstack.worker.protocol.generic`); a template's are special tokens.
    start, end = ('"<tool_call>"', '"</tool_call>"') if fmt == "generic" else ("<tool_call>", "</tool_call>")
    lark = "\n".join([f"start: {start} ({' | '.join(alts)}) {end}", *rules])
    return llguidance.LLMatcher.grammar_from_lark(lark)


def _lower_priority() -> None:
    """Runs first in each compile thread: below the generation thread, where the OS allows it per thread."""
    try:
        if sys.platform == "linux":  # a thread is a task of its own: its id takes a nice value
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)
        elif hasattr(os, "PRIO_DARWIN_THREAD"):  # macOS: the calling thread, to background priority
            os.setpriority(os.PRIO_DARWIN_THREAD, 0, os.PRIO_DARWIN_BG)
    except OSError:
        pass  # a sandbox may refuse it: the compiles then share the CPU evenly, which is what they did


class Grammars:
    """One engine's llguidance tokenizer (built once, on first use: ~1 s for a 150k vocabulary), its
    compiled grammars, and the threads that compile them."""

    def __init__(self, tokenizer, vocab_size: int, cache_size: int = CACHED_GRAMMARS):
        self._hf = tokenizer._tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(tokenizer.eos_token_ids)
        self._lock = threading.Lock()
        self._lltok = None
        self._cache_lock = threading.Lock()  # apart from `_lock`: a lookup never waits for the tokenizer's build
        #: a grammar's text or `source_key` -> a compiled matcher never advanced (handed out as copies), or its refusal
        self._compiled: OrderedDict[str, "llguidance.LLMatcher | str"] = OrderedDict()
        self._cache_size = cache_size
        self._queue = CompileQueue(COMPILE_THREADS, per_client=COMPILE_WAITING_PER_CLIENT, max_waiting=COMPILE_WAITING,
                                   start_seconds=COMPILE_START_SECONDS, initializer=_lower_priority)

    @property
    def lltokenizer(self):
        with self._lock:
            if self._lltok is None:
                self._lltok = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.vocab_size, eos_token=self._eos[0])
            return self._lltok

    @property
    def cached(self) -> int:
        """How many grammars (compiled or refused) are kept."""
        return len(self._compiled)

    @property
    def waiting(self) -> int:
        """Grammars waiting for a compile thread."""
        return self._queue.waiting

    def _known(self, key: str) -> "llguidance.LLMatcher | str | None":
        with self._cache_lock:
            known = self._compiled.get(key)
            if known is not None:
                self._compiled.move_to_end(key)
            return known

    def _compiled_for(self, key: str, build: Callable[[], str]) -> "llguidance.LLMatcher | str":
        """The compiled grammar (never advanced) or its refusal, for `key`; built and compiled in the
        calling thread unless the cache has it. A builder's `GrammarError` is a refusal too."""
        known = self._known(key)
        if known is None:
            try:
                grammar = build()
            except GrammarError as e:
                known = str(e)
            else:
                m = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0, limits=_limits())
                known = _reason(m.get_error()) if m.is_error() else m
            if len(key) <= CACHED_KEY_CHARS:
                with self._cache_lock:
                    self._compiled[key] = known
                    while len(self._compiled) > self._cache_size:
                        self._compiled.popitem(last=False)
        return known

    @staticmethod
    def _fresh(known: "llguidance.LLMatcher | str") -> "llguidance.LLMatcher":
        if isinstance(known, str):
            raise GrammarError(known)
        return known.deep_copy()

    def matcher(self, grammar: str) -> "llguidance.LLMatcher":
        """A fresh matcher for `grammar`, compiled in the calling thread (or copied from the cache);
        `GrammarError` saying why it cannot be. Blocks: the server calls `compile` instead."""
        return self._fresh(self._compiled_for(grammar, lambda: grammar))

    async def compile(self, grammar: "str | partial", seconds: float = COMPILE_SECONDS, *, client: str = "",
                      key: str | None = None) -> "llguidance.LLMatcher":
        """A fresh matcher for `grammar` (its text, or a builder whose `source_key` names it, `key`
        when the caller has it already): from the cache at once, else built and compiled on the
        compile threads in `client`'s turn. `GrammarError` when it cannot be compiled or takes more
        than `seconds` once started; `Busy` when the worker is too busy to start it (see
        `mtpstack.worker.protocol.compile_queue`)."""
        if isinstance(grammar, str):
            key, build = grammar, (lambda: grammar)
        else:
            key, build = key or source_key(grammar), grammar
        known = self._known(key)
        if known is None:
            try:
                known = await self._queue.run(key, partial(self._compiled_for, key, build), client, seconds)
            except TimeoutError:
                raise GrammarError(f"it did not compile within {seconds:g} s") from None
        return self._fresh(known)
