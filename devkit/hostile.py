"""Hostile input, generated: configs for `validate`, raw HTTP and odd JSON for the proxy and
the worker. Pure generators (seeded `random.Random`); the raw-socket clients that send them and
the slow clients are in `devkit.raw_http`. The fuzz tests (`tests/*/test_fuzz*.py`) and
`bench/scripts/load_bench.py hostile` both draw from here.
"""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import yaml

from devkit.raw_http import request_bytes

ROOT = Path(__file__).resolve().parents[1]
VALID_FLEET = ROOT / "examples" / "valid" / "mixed-models.yaml"

# -- configs -------------------------------------------------------------------------------

#: Values that are wrong somewhere in every config: types, ranges, non-finite and huge numbers.
ODD_VALUES: list = [
    None, True, -1, 0, 2**31, 2**63, 2**64 + 1, 10**30, 1e309, -1e309, float("nan"), 0.5, "", "8080", "x" * 300,
    "\u202e", "\ud7ff", [], {}, [[[]]], {"a": {"b": {}}}, ["a", 1, None], "0x10", "1_000",
]
#: YAML-level fragments spliced in as a value: anchors and aliases, tags, odd scalars.
YAML_VALUES = [
    "*nope", "&a 1", "!!python/object:os.system 'true'", "!!binary aGVsbG8=", "!!binary ***", "!!timestamp 2024-13-45",
    "2024-02-30", "!custom x", "!!set {a, b}", "!!int x", "!!float y", "!!str 1", ".nan", "-.inf", "0x" + "f" * 40,
    "0b" + "1" * 80, "0o777", "1:30:00", "1_000_000", "9" * 5000, "~", "null", "yes", "NO", "0777", "+12", "'\\ud800'",
    '"\\ud800"', '"\\x00"', "|\n  block", "{a: 1, a: 2}", "[1, [2, [3]]]", "? [a]\n  : b", "&x {y: *x}",
]


def valid_fleet() -> dict:
    return yaml.safe_load(VALID_FLEET.read_text())


def _paths(data, prefix=()) -> list[tuple]:
    out = [prefix]
    if isinstance(data, dict):
        for k, v in data.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _paths(v, prefix + (i,))
    return out


def _set(data, path, value):
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def nested(rng: random.Random, depth: int | None = None) -> str:
    depth = depth if depth is not None else rng.choice([5, 31, 33, 100, 999, 1001, 2000, 20_000])
    open_, close = rng.choice([("[", "]"), ("{a: ", "}")])
    return open_ * depth + "1" + close * depth


def alias_bomb(rng: random.Random) -> str:
    levels, width = rng.randint(2, 9), rng.randint(2, 9)
    lines = ["b0: &b0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _odd(rng: random.Random):
    return copy.deepcopy(rng.choice(ODD_VALUES))  # a fresh copy: a shared one could be nested into itself


def mutate_structure(rng: random.Random, data: dict) -> dict:
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 4)):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = rng.choice(paths)
        action = rng.randrange(5)
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if action == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == 1 and isinstance(parent, dict):
            key = str(path[-1])
            parent[key[:-1] + key[-1:].swapcase() + rng.choice(["", "s", "_"])] = _odd(rng)
        elif action == 2 and isinstance(parent, dict):
            parent[rng.choice(["extra", "x-anchor", "<<", "1", ""])] = _odd(rng)
        else:
            _set(data, path, _odd(rng))
    return data


def _dump(rng: random.Random, data: dict) -> tuple[str, str]:
    if rng.random() < 0.3:
        return ".json", json.dumps(data, allow_nan=True)
    return ".yaml", yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def mutate_text(rng: random.Random, text: str, suffix: str) -> tuple[str, bytes]:
    """One YAML- or byte-level mutation of a config's text."""
    lines = text.splitlines()
    kind = rng.randrange(9)
    if kind == 0:  # a value replaced by a YAML fragment
        i = rng.randrange(len(lines))
        if ":" in lines[i]:
            head = lines[i].split(":", 1)[0]
            lines[i] = f"{head}: {rng.choice(YAML_VALUES)}"
    elif kind == 1:  # deep nesting under a key
        lines.insert(rng.randrange(len(lines) + 1), f"deep: {nested(rng)}")
    elif kind == 2:  # an alias bomb beside the config, and maybe used in it
        lines = alias_bomb(rng).splitlines() + lines
    elif kind == 3:  # a duplicated line (duplicate key)
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif kind == 4:  # a huge or odd number
        i = rng.randrange(len(lines))
        if ":" in lines[i]:
            lines[i] = lines[i].split(":", 1)[0] + ": " + rng.choice(["9" * 5000, "-" + "9" * 40, "1e999", ".inf", "0x" + "f" * 4000])
    elif kind == 5:  # truncation
        return suffix, "\n".join(lines)[: rng.randrange(len(text) + 1)].encode()
    elif kind == 6:  # an encoding
        encoded = "\n".join(lines)
        codec = rng.choice(["utf-16", "utf-32", "latin-1", "utf-8-sig", "cp1252"])
        return suffix, (encoded + "\nnote: caf\u00e9").encode(codec, errors="replace")
    elif kind == 7:  # raw bytes: NUL, invalid UTF-8, control characters
        raw = bytearray("\n".join(lines).encode())
        for _ in range(rng.randint(1, 5)):
            raw.insert(rng.randrange(len(raw) + 1), rng.choice([0, 0xFF, 0xC3, 0x1B, 0x09, 0x85, 0x0C]))
        return suffix, bytes(raw)
    else:  # a self-referencing anchor
        lines.append(rng.choice(["loop: &l {x: *l}", "loop: &l [*l]", "proxy: &p {queue: *p}"]))
    return suffix, ("\n".join(lines) + "\n").encode()


def random_config(rng: random.Random) -> tuple[str, bytes]:
    """A config file (suffix, bytes): a valid fleet, mutated in structure, in text, or both."""
    data = valid_fleet()
    if rng.random() < 0.7:
        data = mutate_structure(rng, data)
    suffix, text = _dump(rng, data)
    if rng.random() < 0.7 or suffix == ".json" and rng.random() < 0.2:
        return mutate_text(rng, text, suffix)
    return suffix, text.encode()


# -- HTTP ---------------------------------------------------------------------------------



#: Malformed HTTP that aiohttp's parser must refuse (400), named by what is wrong.
MALFORMED_HTTP: dict[str, bytes] = {
    "bad-content-length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    "duplicate-content-length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "negative-content-length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
    "te-with-cl": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "bad-chunk-size": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "unknown-transfer-encoding": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, rot13\r\n\r\n",
    "nul-in-path": b"POST /v1/comp\x00letions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    "huge-header": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
    "many-headers": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"Content-Length: 2\r\n\r\n{}",
    "header-without-colon": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBroken header\r\nContent-Length: 2\r\n\r\n{}",
    "space-before-colon": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length : 2\r\n\r\n{}",
    "bad-version": b"POST /v1/completions HTTP/9.9\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    "garbage-request-line": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40)) + b"\r\n\r\n",
    "bare-lf": b"POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
    "obs-fold": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n continued\r\nContent-Length: 2\r\n\r\n{}",
    "ctl-in-header-value": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\nContent-Length: 2\r\n\r\n{}",
}


def _mutate(rng: random.Random, data: bytes, times: int) -> bytes:
    raw = bytearray(data)
    for _ in range(times):
        if not raw:
            break
        i = rng.randrange(len(raw))
        op = rng.randrange(3)
        if op == 0:
            raw[i] = rng.randrange(256)
        elif op == 1:
            del raw[i]
        else:
            raw.insert(i, rng.choice(b"\r\n\x00:; \t{}[]\"\\"))
    return bytes(raw)


def random_http(rng: random.Random, path: str = "/v1/completions", model: str = "m") -> bytes:
    """A fixed malformed case, or a request whose body and head have random bytes flipped,
    dropped or added. The Content-Length line is left whole and counts the mutated body: a
    body shorter than announced is a slow client, which `slow_client` covers."""
    if rng.random() < 0.3:
        return rng.choice(list(MALFORMED_HTTP.values()))
    body = _mutate(rng, random_body(rng, model), rng.randint(0, 3))
    head, _, _ = request_bytes(path, body).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(i for i, line in enumerate(lines) if line.startswith(b"Content-Length:"))
    mutated = [line if i == length else _mutate(rng, line, rng.choice([0, 0, 1, 2])) for i, line in enumerate(lines)]
    return b"\r\n".join(mutated) + b"\r\n\r\n" + body


#: Field values that no endpoint can serve.
ODD_FIELDS = {
    "model": [None, 1, [], "m" * 1000, "\u0000"],
    "prompt": [[2147483648], [100000000], [-1, -2], [1000000000000], [], [[1]], ["a", "b"], [True], "\ud800", "", 1.5],
    "messages": [[], [{}], [{"role": 1}], [{"role": "user", "content": [{"type": "image"}]}], "hi",
                 [{"role": "user", "content": "\udfff"}], [{"role": "user", "content": {"a": 1}}]],
    "max_tokens": [-1, 0, 2**31, 2**70, 1.5, "10", float("nan"), float("inf"), True],
    "temperature": [float("nan"), float("inf"), -1, 3, "0", [], 1e308],
    "top_p": [float("nan"), -0.1, 1.1, {}, float("-inf")],
    "seed": [-1, 2**63, 2**70, 1.5, "1", float("nan")],
    "n": [0, 2, 2**70, -1, float("nan"), "1"],
    "stop": [1, [1], ["a"] * 5, "\ud800", [None], {"a": 1}],
    "stream": ["yes", 1, None, []],
    "stream_options": ["x", [], {"include_usage": "yes"}],
    "num_draft_tokens": [-1, 2**70, 1.5, float("nan")],
    "ignore_eos": ["no", 2],
    "logprobs": [True, 5],
    "response_format": [{"type": "json_object"}, "x"],
}


def random_body(rng: random.Random, model: str = "m") -> bytes:
    """An odd JSON body: a plausible request with odd fields, or JSON (or not) of odd shape.
    A body that happens to be valid asks for 2 tokens, so a real worker answers it quickly."""
    kind = rng.randrange(6)
    if kind == 0:
        depth = rng.choice([63, 64, 65, 200, 1000, 50_000])
        return ('{"model": "%s", "prompt": ' % model + "[" * depth + "1" + "]" * depth + "}").encode()
    if kind == 1:
        return rng.choice([
            b"", b"null", b"[]", b"1", b'"x"', b"{", b"{'a': 1}", b"\xff\xfe\x00", b"NaN",
            ('{"model": "%s", "max_tokens": %s}' % (model, "9" * rng.choice([20, 4300, 5000]))).encode(),
            ('{"model": "%s", "prompt": "x", "max_tokens": 1e999}' % model).encode(),
            '{"model": "m", "prompt": "\\ud800\\udfff\\u0000"}'.encode(),
        ])
    body: dict = {"model": model, "max_tokens": 2}
    body["messages" if rng.random() < 0.5 else "prompt"] = rng.choice(
        [[{"role": "user", "content": "hi"}], "hi"]
    )
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(list(ODD_FIELDS))
        body[key] = rng.choice(ODD_FIELDS[key])
    return json.dumps(body, allow_nan=True).encode(errors="surrogatepass")


# -- the agent surfaces: tools, tool_choice, Responses items, JSON schemas ---------------

#: The shapes that answered 500 with a traceback, or were served, before issue 23: each request
#: answered 400 naming its field now. (path, body without `model`, the `param` named.)
AGENT_SEEDS: dict[str, tuple[str, dict, str]] = {
    "tool-choice-function-a-string": (
        "/v1/chat/completions",
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": "f"}},
        "tool_choice"),
    "required-not-names": (
        "/v1/chat/completions",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": [{"x": 1}]}}}], "tool_choice": "required"},
        "tools[0].function.parameters.required"),
    "arguments-50k-deep": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 50_000 + "]" * 50_000}}]}]},
        "messages[1].tool_calls[0].function.arguments"),
    "arguments-5000-digits": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": ' + "9" * 5000 + "}"}}]}]},
        "messages[1].tool_calls[0].function.arguments"),
    "responses-arguments-50k-deep": (
        "/v1/responses",
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 50_000 + "]" * 50_000}]},
        "input[0].arguments"),
    "responses-text-a-string": ("/v1/responses", {"input": "hi", "text": "x"}, "text"),
    "responses-call-id-an-object": (
        "/v1/responses", {"input": [{"type": "function_call", "call_id": {"a": 1}, "name": "f", "arguments": "{}"}]},
        "input[0].call_id"),
    "parameters-a-number": (
        "/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": 5}]}, "tools[0].parameters"),
    "tool-call-id-an-integer": (
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": 7, "content": "x"}]},
        "messages[1].tool_call_id"),
    "invalid-pattern": (
        "/v1/chat/completions",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(abc"}}}},
        "response_format"),
}

#: Parts of a JSON schema that compile slowly, fail to compile, or must not be acted on.
ODD_PATTERNS = ["(abc", "[", "a{1000}{1000}", "(a+)+$", "(a|aa)*b", "\\", "(?<name>x)", "[z-a]", "\\p{Nope}", ".*" * 50]
ODD_TYPES = ["frob", 5, None, ["string", "frob"], [], {"a": 1}]
REMOTE_REFS = ["http://127.0.0.1:9/schema.json", "file:///etc/passwd", "#/$defs/missing", "#/$defs/self"]


def hostile_schema(rng: random.Random, depth: int = 0) -> object:
    """A JSON schema that is odd, expensive or wrong somewhere (or, now and then, fine)."""
    kind = rng.randrange(12 if depth < 3 else 8)
    if kind == 0:
        return {"type": rng.choice(ODD_TYPES)}
    if kind == 1:
        return {"type": "string", "pattern": rng.choice(ODD_PATTERNS)}
    if kind == 2:  # integer ranges: the lexer's work grows with them (the issue's 56 KB anyOf)
        n, step = rng.choice([10, 100, 300]), rng.choice([7, 1000, 123_457])
        return {"anyOf": [{"type": "integer", "minimum": -i * step - 17, "maximum": i * step * 8 + 523} for i in range(n)]}
    if kind == 3:
        return {"enum": [f"value-{i}" for i in range(rng.choice([1, 500, 5000]))]}
    if kind == 4:
        return {"$ref": rng.choice(REMOTE_REFS), "$defs": {"self": {"$ref": "#/$defs/self"}}}
    if kind == 5:
        return {"type": "integer", "minimum": rng.choice([10**9, -(10**9), 2**63, 1.5]), "maximum": rng.choice([10**9, 0, -1])}
    if kind == 6:
        return rng.choice([True, False, 5, "x", [], None, {}])
    if kind == 7:
        return {"type": "string", "minLength": rng.choice([-1, 10**9, "3"]), "maxLength": rng.choice([0, 10**12, None]),
                "format": rng.choice(["date-time", "uuid", "frob"])}
    props = {f"p{i}": hostile_schema(rng, depth + 1) for i in range(rng.randint(1, 3))}
    if kind == 8:
        return {"type": "object", "properties": props, "required": rng.choice([list(props), "p0", [1], [{"a": 1}]]),
                "additionalProperties": rng.choice([False, True, 5, {"type": "frob"}])}
    if kind == 9:
        return {"type": "array", "items": hostile_schema(rng, depth + 1), "minItems": rng.choice([0, 10**6]), "maxItems": 3}
    if kind == 10:
        return {rng.choice(["anyOf", "oneOf", "allOf"]): [hostile_schema(rng, depth + 1) for _ in range(rng.randint(1, 4))]}
    return {"type": "object", "properties": props}


def _hostile_tool(rng: random.Random, responses: bool):
    name = rng.choice(["f", "get_weather", "", "a<b", "x" * 300, 5, None])
    params = rng.choice([hostile_schema(rng), {"type": "object", "properties": {"x": hostile_schema(rng)}, "required": ["x"]},
                         {"type": "object", "properties": {"x": {"type": "string"}}}])
    if rng.random() < 0.1:
        return rng.choice([5, "f", None, {"type": "web_search"}, {"type": "function"}])
    if responses:
        return {"type": "function", "name": name, "parameters": params}
    return {"type": "function", "function": {"name": name, "parameters": params}}


def _tool_choice(rng: random.Random, responses: bool):
    name = rng.choice(["f", "get_weather", "missing", 5, None, {"a": 1}])
    named = {"type": "function", "name": name} if responses else {"type": "function", "function": rng.choice([{"name": name}, "f", 5, None])}
    return rng.choice(["auto", "none", "required", "sometimes", 5, [], {}, {"type": "allowed_tools"}, named, named])


def _arguments(rng: random.Random):
    return rng.choice(['{"x": 1}', "{oops", "[1, 2]", "", "null", {"x": 1}, 5, None, [],
                       "[" * rng.choice([63, 65, 5000]) + "]" * 5000, '{"x": ' + "9" * rng.choice([10, 4300, 5000]) + "}"])


def _history(rng: random.Random) -> list:
    call = {"id": rng.choice(["call_1", 5, {"a": 1}, None]), "type": "function",
            "function": rng.choice([{"name": "f", "arguments": _arguments(rng)}, {"name": 5}, "f", None])}
    turns = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": rng.choice(["", None, 5]), "tool_calls": rng.choice([[call], call, "x", []])},
             {"role": "tool", "tool_call_id": rng.choice(["call_1", 7, {"a": 1}, None]), "content": rng.choice(["ok", 5, [{"type": "text", "text": "ok"}]])}]
    return turns[: rng.randint(1, 3)]


def _input_items(rng: random.Random) -> list:
    items = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        if kind == 0:
            items.append({"type": "function_call", "call_id": rng.choice(["c1", {"a": 1}, 5, None]),
                          "name": rng.choice(["f", "", 5, None]), "arguments": _arguments(rng)})
        elif kind == 1:
            items.append({"type": "function_call_output", "call_id": rng.choice(["c1", 5, []]),
                          "output": rng.choice(["ok", 5, None, [{"type": "output_text", "text": "ok"}], [{"type": "image"}]])})
        elif kind == 2:
            items.append({"role": rng.choice(["user", "assistant", "wizard", 5]), "content": rng.choice(
                ["hi", 5, None, [{"type": "input_text", "text": "hi"}], [{"type": "input_image"}]])})
        elif kind == 3:
            items.append({"type": "reasoning", "summary": []})
        elif kind == 4:
            items.append(rng.choice([5, "x", None, {"type": "frob"}, {}]))
        else:
            items.append({"type": "message", "role": "user", "content": "hi"})
    return items


def random_agent_request(rng: random.Random, model: str = "m") -> tuple[str, bytes]:
    """(path, body): a chat or Responses request whose tools, `tool_choice`, history, input items
    or JSON schema are hostile; a seed of `AGENT_SEEDS` one time in five. Every request asks for 2
    tokens without thinking, so one that is served is served quickly."""
    if rng.random() < 0.2:
        path, body, _ = seed_request(rng.choice(sorted(AGENT_SEEDS)), model)
        return path, body
    if rng.random() < 0.5:
        path = "/v1/chat/completions"
        body = {"messages": _history(rng) if rng.random() < 0.4 else [{"role": "user", "content": "hi"}]}
        if rng.random() < 0.6:
            body["tools"] = [_hostile_tool(rng, False) for _ in range(rng.randint(1, 3))]
            body["tool_choice"] = _tool_choice(rng, False)
        else:
            body["response_format"] = rng.choice([
                {"type": "json_schema", "json_schema": {"name": "x", "schema": hostile_schema(rng)}},
                {"type": "json_schema", "json_schema": rng.choice([5, {"schema": 5}, {}])}, {"type": "json_object"},
                {"type": "frob"}, "json"])
    else:
        path = "/v1/responses"
        body = {"input": _input_items(rng) if rng.random() < 0.5 else "hi"}
        if rng.random() < 0.5:
            body["tools"] = [_hostile_tool(rng, True) for _ in range(rng.randint(1, 3))]
            body["tool_choice"] = _tool_choice(rng, True)
        if rng.random() < 0.4:
            body["text"] = rng.choice(["x", 5, {"format": "x"}, {"format": {"type": "frob"}},
                                       {"format": {"type": "json_schema", "name": "x", "schema": hostile_schema(rng)}}])
    return path, _agent_body(path, body, model)


def seed_request(name: str, model: str = "m") -> tuple[str, bytes, str]:
    """(path, body, the `param` its refusal names) for one of `AGENT_SEEDS`."""
    path, body, param = AGENT_SEEDS[name]
    return path, _agent_body(path, body, model), param


def _agent_body(path: str, body: dict, model: str) -> bytes:
    """`body` made a whole request: a prompt if it has none, 2 tokens, no thinking."""
    if path == "/v1/responses":
        whole = {"model": model, "input": "hi", "max_output_tokens": 2}
    else:
        whole = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return json.dumps({**whole, "chat_template_kwargs": {"enable_thinking": False}, **body}).encode()


def agent_stream(i: int) -> tuple[str, dict]:
    """(path, body) of a long stream on one of the agent answer paths, by turns: a Responses stream,
    a chat stream that may call a tool, a forced call."""
    no_think = {"chat_template_kwargs": {"enable_thinking": False}}
    if i % 3 == 0:
        return "/v1/responses", {"input": "Say something long", "stream": True, "max_output_tokens": 400, **no_think}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather?"}], "stream": True, "max_tokens": 400,
                                    "ignore_eos": True, "tools": [tool], "tool_choice": "required" if i % 3 == 2 else "auto",
                                    **no_think}


# -- Anthropic's Messages API --------------------------------------------------------------

MESSAGES_PATH = "/v1/messages"
#: Odd content blocks, in a user turn or an assistant turn.
ODD_BLOCKS = [5, None, "x", {}, {"type": 5}, {"type": "text"}, {"type": "text", "text": 5}, {"type": "image"},
              {"type": "image", "source": {"type": "base64", "data": "AA=="}}, {"type": "document", "source": 5},
              {"type": "frob_20990101"}, {"type": "redacted_thinking", "data": "x"},
              {"type": "thinking", "thinking": 5}, {"type": "thinking", "thinking": "", "signature": "mtp1.!!"},
              {"type": "thinking", "thinking": "", "signature": "mtp1." + "A" * 4000},
              {"type": "tool_use", "id": 5, "name": "f", "input": {}}, {"type": "tool_use", "name": "", "input": {}},
              {"type": "tool_use", "id": "t", "name": "f", "input": "[" * 5000 + "]" * 5000},
              {"type": "tool_use", "id": "t", "name": "f", "input": [1]},
              {"type": "tool_result", "tool_use_id": {"a": 1}, "content": "x"},
              {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}, 5]},
              {"type": "tool_result", "tool_use_id": "t", "content": "ok", "is_error": "yes"},
              {"type": "text", "text": "\ud800"}, {"type": "text", "text": "hi", "cache_control": 5}]


def _anthropic_tool(rng: random.Random):
    if rng.random() < 0.15:
        return rng.choice([5, "f", None, {}, {"type": "web_search_20250305", "name": "web_search"}, {"type": 5},
                           {"type": "custom", "name": "f"}])
    return {"name": rng.choice(["f", "get_weather", "", "a<b", "x" * 300, 5, None]),
            "input_schema": rng.choice([hostile_schema(rng), {"type": "object", "properties": {"x": hostile_schema(rng)},
                                                              "required": ["x"]}, 5, None])}


def _messages_turns(rng: random.Random) -> list:
    turns = []
    for _ in range(rng.randint(1, 4)):
        role = rng.choice(["user", "user", "assistant", "system", "robot", 5, None])
        content = rng.choice(["hi", 5, None, [], {"a": 1}, [rng.choice(ODD_BLOCKS) for _ in range(rng.randint(1, 3))]])
        turns.append({"role": role, "content": content} if rng.random() < 0.9 else rng.choice([5, "x", None, []]))
    return turns


def random_messages_request(rng: random.Random, model: str = "m") -> tuple[str, bytes]:
    """(path, body): a `/v1/messages` (now and then `count_tokens`) request whose system, turns,
    blocks, tools, `tool_choice`, thinking or other fields are hostile. Every request asks for 2
    tokens, so one that is served is served quickly."""
    body: dict = {"model": model, "max_tokens": 2, "thinking": {"type": "disabled"},
                  "messages": _messages_turns(rng) if rng.random() < 0.6 else [{"role": "user", "content": "hi"}]}
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(10)
        if kind == 0:
            body["system"] = rng.choice([5, {"a": 1}, [5], [{"type": "image"}], [{"type": "text", "text": 5}], "\ud800",
                                         [{"type": "text", "text": "x" * 50_000}]])
        elif kind == 1:
            body["tools"] = rng.choice([[_anthropic_tool(rng) for _ in range(rng.randint(1, 3))], 5, {}, "x"])
        elif kind == 2:
            body["tool_choice"] = rng.choice(["any", 5, {}, {"type": "frob"}, {"type": "tool"}, {"type": "tool", "name": 5},
                                              {"type": "tool", "name": "missing"}, {"type": "any"},
                                              {"type": "auto", "disable_parallel_tool_use": "yes"}])
        elif kind == 3:
            body["thinking"] = rng.choice([5, {}, {"type": "enabled"}, {"type": "enabled", "budget_tokens": -1},
                                           {"type": "enabled", "budget_tokens": 2**70}, {"type": "adaptive", "display": 5},
                                           {"type": "frob"}])
        elif kind == 4:
            body["output_config"] = rng.choice([5, {"effort": "extreme"}, {"effort": 5}, {"format": 5},
                                                {"format": {"type": "json_schema", "schema": hostile_schema(rng)}}])
        elif kind == 5:
            body["stop_sequences"] = rng.choice(["END", [5], ["a"] * 5, [None], ["\ud800"], []])
        elif kind == 6:
            body["max_tokens"] = rng.choice([-1, 0, 2**31, 2**70, 1.5, "10", None, True])
        elif kind == 7:
            body[rng.choice(["temperature", "top_p", "top_k"])] = rng.choice([float("nan"), -1, 3, "0", [], 1e308, True])
        elif kind == 8:
            body["metadata"] = rng.choice([5, {"user_id": 5}, {"user_id": "{" + "[" * 5000}, {"user_id": '{"session_id": [1]}'}])
        else:
            body[rng.choice(["frobnicate", "container", "context_management", "mcp_servers"])] = rng.choice([5, {"a": [1]}, None])
    path = MESSAGES_PATH + ("/count_tokens" if rng.random() < 0.15 else "") + ("?beta=true" if rng.random() < 0.5 else "")
    return path, json.dumps(body, allow_nan=True).encode(errors="surrogatepass")


#: Anthropic's own refusal of a prompt that does not fit, whole: the one that names no field (Claude
#: Code compacts on exactly these words).
ANTHROPIC_TOO_LONG = re.compile(r"prompt is too long: \d+ tokens > \d+ maximum")


def anthropic_refusal_names_a_field(payload) -> bool:
    """A 400 in Anthropic's error shape whose message starts with the field it is about (`param: ...`),
    or is Anthropic's own `prompt is too long: N tokens > M maximum`."""
    if not isinstance(payload, dict) or payload.get("type") != "error":
        return False
    error = payload.get("error")
    if not isinstance(error, dict) or error.get("type") != "invalid_request_error":
        return False
    message = str(error.get("message", ""))
    if ANTHROPIC_TOO_LONG.fullmatch(message):
        return True
    field, sep, rest = message.partition(": ")
    return bool(sep and rest and field and " " not in field)
