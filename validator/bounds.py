"""Bounds on untrusted JSON: request bodies (proxy and worker) and, through `depth_exceeds`, configs.

Python's `json` recurses once per level of nesting and `int()` refuses more than
4,300 digits; both surface as exceptions that are not `JSONDecodeError`. A body
that trips either is the client's mistake, so it must come back as a plain
reason, never as a 500.
"""

from __future__ import annotations

import json

#: Deepest nesting of lists and objects accepted in a request body. OpenAI requests nest
#: 4-6 levels (messages, content parts); tool schemas, which the worker refuses anyway, a
#: few more. Far below the interpreter's recursion limit, so nothing downstream can recurse
#: itself to death on an accepted body.
MAX_REQUEST_DEPTH = 64
#: Longest request header (name and value) the proxy and the worker read, over aiohttp's 8,190:
#: a header past it is refused by the HTTP parser in plain text, naming nothing; one below it
#: reaches the handlers, which refuse an unusable value (an `X-Mtpstack-Class` of 10 KB) in
#: OpenAI's shape, naming it. At most 128 headers, so a request head stays within 2 MiB.
MAX_HEADER_BYTES = 16 * 1024


class BodyError(ValueError):
    """A request body that cannot be used; `str()` is one plain sentence for the client."""


def depth_exceeds(value: object, limit: int) -> bool:
    """True when `value` (plain data: dicts, lists, scalars) nests more than `limit` levels.
    Iterative, so any depth is safe to ask about."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def parse_json_body(body: bytes | str, max_depth: int = MAX_REQUEST_DEPTH, what: str = "the request body") -> object:
    """The JSON value of a request body (or of JSON text inside one, `what` naming it), or
    `BodyError` saying why there is none."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise BodyError(f"{what} nests deeper than {max_depth} levels") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int()'s digit limit
        if "integer string conversion" in str(e):
            raise BodyError(f"{what} holds a number too long to read (more than 4300 digits)") from None
        reason = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e)
        raise BodyError(f"{what} is not valid JSON: {reason}") from None
    # Fewer brackets than the limit cannot nest deeper than it: most bodies skip the walk.
    opening = (body.count("[") + body.count("{")) if isinstance(body, str) else (body.count(b"[") + body.count(b"{"))
    if opening > max_depth and depth_exceeds(value, max_depth):
        raise BodyError(f"{what} nests deeper than {max_depth} levels")
    return value
