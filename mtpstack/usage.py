"""The usage comment a native worker adds to each event of a stream the proxy relays, so the proxy can
charge a tenant what its client was sent, even when the client leaves before the stream's usage object.

Asked for by the proxy's `X-Mtpstack-Usage: 1` header; the comment (`: usage PROMPT CACHED COMPLETION`,
the tokens as the worker's usage object counts them at that event) goes inside the event, after its
data and before its blank line: every SSE client skips a comment line, and the event keeps its first line.
A final event (`FINAL_EVENTS`) goes out as it is, so every stream still ends exactly as its API's does;
what it was sent by then is what the comment before it said.
"""

from __future__ import annotations

from mtpstack.endpoints import FINAL_EVENTS

USAGE_HEADER = "X-Mtpstack-Usage"
_FINALS = tuple({prefix for prefixes in FINAL_EVENTS.values() for prefix in prefixes})


def usage_comment(prompt: int, cached: int, completion: int) -> bytes:
    return b": usage %d %d %d\n" % (prompt, cached, completion)


def with_usage(data: bytes, prompt: int, cached: int, completion: int) -> bytes:
    """`data` (whole events) with the comment in its last event; a final event or a piece as it is."""
    if not data.endswith(b"\n\n") or data.startswith(_FINALS):
        return data
    return data[:-1] + usage_comment(prompt, cached, completion) + b"\n"
