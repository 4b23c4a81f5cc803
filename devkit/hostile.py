"""Hostile input, generated: configs for `validate`, raw HTTP and odd JSON for the proxy and
the worker. Pure generators (seeded `random.Random`); the raw-socket clients that send them and
the slow clients are in `devkit.raw_http`. The fuzz tests (`tests/*/test_fuzz*.py`) and
`bench/scripts/hostile_bench.py` both draw from here.
"""

from __future__ import annotations

import copy
import json
import random
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
