"""OpenAI's structured-output semantics for the schemas a grammar is built from.

Two rewrites, applied to a copy of the client's schema before llguidance compiles it:

- **Closed objects** (`closed=True`: `response_format` `json_schema`, and tools sent with
  `strict: true`): an object schema that does not say `additionalProperties` gets `false`, as
  OpenAI's structured outputs read it. Without this a model may append keys after the declared
  ones until `max_tokens` (instructor's JSON_SCHEMA mode and `llm --schema` send schemas without
  the key).
- **Values that end**: a number, integer or string the schema leaves unbounded gets a documented
  bound, so a small model cannot run one value (`1111...`) into `max_tokens`:
  an integer is within +-(10^18 - 1) (at most 18 digits), a number within +-10^15 with at most 9
  decimals (`multipleOf` 1e-9: llguidance then writes no exponent), a string at most
  `string_cap(tokens)` characters: `MAX_STRING_CHARS`, or half the tokens the answer has left
  when that is fewer (at least `MIN_STRING_CHARS`), so even a forced call with a long string ends
  within `max_tokens`. A bound the schema sets itself is kept as it is.

Only the keywords that hold subschemas are followed, to `MAX_DEPTH` levels (the request body's own
nesting bound); `$ref`s are left alone (their targets under `$defs`/`definitions` are rewritten).
"""

from __future__ import annotations

#: Largest integer an unbounded `integer` may take (18 digits), and the bound of a `number`.
MAX_INTEGER = 10**18 - 1
MAX_NUMBER = 10**15
#: A `number` the schema does not bound is written with at most this many decimals.
NUMBER_STEP = 1e-9
#: Characters in a string the schema gives no `maxLength` (nor `enum`/`const`), at most and at least.
MAX_STRING_CHARS = 4096
MIN_STRING_CHARS = 16
#: Nesting followed; deeper subschemas are left as they are.
MAX_DEPTH = 64

#: Keywords whose value is one subschema, a list of them, or a name -> subschema map.
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames", "unevaluatedItems",
        "unevaluatedProperties")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def bounded(schema, *, closed: bool, max_string: int = MAX_STRING_CHARS):
    """A copy of `schema` with unbounded values bounded (a string to `max_string` characters) and,
    when `closed`, objects closed."""
    return _rewrite(schema, closed, max_string, 0)


def string_cap(tokens: int) -> int:
    """The length of an unbounded string when the answer has `tokens` tokens left."""
    return max(MIN_STRING_CHARS, min(MAX_STRING_CHARS, tokens // 2))


def _types(schema: dict) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()


def _rewrite(schema, closed: bool, max_string: int, depth: int):
    if not isinstance(schema, dict) or depth >= MAX_DEPTH:
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _rewrite(out[key], closed, max_string, depth + 1)
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [_rewrite(s, closed, max_string, depth + 1) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: _rewrite(s, closed, max_string, depth + 1) for k, s in out[key].items()}
    extra = out.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = _rewrite(extra, closed, max_string, depth + 1)
    types = _types(out)
    if closed and "additionalProperties" not in out and ("object" in types or isinstance(out.get("properties"), dict)):
        out["additionalProperties"] = False
    fixed = "enum" in out or "const" in out
    if not fixed and types & {"integer", "number"}:
        limit = MAX_INTEGER if types & {"integer", "number"} == {"integer"} else MAX_NUMBER
        _bound(out, "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", -limit)
        _bound(out, "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", limit)
        if limit == MAX_NUMBER:
            out.setdefault("multipleOf", NUMBER_STEP)
    if not fixed and "string" in types and "maxLength" not in out:
        out["maxLength"] = max_string
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bound(schema: dict, key: str, exclusive: str, other: str, other_exclusive: str, limit: int) -> None:
    """Set `key` to `limit` when the schema bounds neither it nor `exclusive`, and the other side
    (if any) leaves room: a client's `minimum: 10**20` keeps its own range, unbounded above."""
    if key in schema or exclusive in schema:
        return
    for side in (other, other_exclusive):
        if _number(schema.get(side)) and (schema[side] >= limit if limit > 0 else schema[side] <= limit):
            return
    schema[key] = limit
