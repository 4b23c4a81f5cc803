"""The tokens a request used, read from the worker's own usage object: a plain answer's `usage`, and
for a stream the last `: usage PROMPT CACHED COMPLETION` comment the worker puts in each event (what
had been generated when that event went out), so a client that leaves mid-stream is charged what it
was sent. Streams of a worker that writes no such comment (mlx_lm.server) count the usage object of
their last events, when the client asked for one (`stream_options.include_usage`)."""

from __future__ import annotations

import json
import re

from mtpstack.usage import USAGE_HEADER  # noqa: F401  (the header that asks a worker for the comment)

_COMMENT = re.compile(rb"\n: usage (\d{1,12}) (\d{1,12}) (\d{1,12})\n")
Usage = tuple[int, int, int]  # prompt tokens, of them read from a cache, completion tokens


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def from_object(usage) -> Usage | None:
    """OpenAI's (`prompt_tokens`...), the Responses API's (`input_tokens`, `output_tokens`) or
    Anthropic's (`input_tokens` uncached, `cache_read_input_tokens`) usage object, as one shape."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage:
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return _int(usage["prompt_tokens"]), cached, _int(usage.get("completion_tokens"))
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        cached = _int(usage.get("cache_read_input_tokens"))
        prompt = _int(usage.get("input_tokens")) + cached + _int(usage.get("cache_creation_input_tokens"))
        return prompt, cached, _int(usage.get("output_tokens"))
    if "input_tokens" in usage:
        details = usage.get("input_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return _int(usage["input_tokens"]), cached, _int(usage.get("output_tokens"))
    return None


_DECODER = json.JSONDecoder()
_USAGE_KEY = re.compile(rb'"usage"\s*:\s*\{')


def from_body(data: bytes) -> Usage | None:
    """A plain answer's `usage` (a Responses answer's is at the top level too). Every API writes it
    last, so the last `"usage": {` is decoded alone (quotes inside strings are escaped: only a key
    reads so); anything else unusual, and the whole body is parsed."""
    i = data.rfind(b'"usage"')
    if i < 0:
        return None
    key = _USAGE_KEY.match(data, i)
    if key is not None:
        try:
            usage, _ = _DECODER.raw_decode(data[key.end() - 1:].decode())
            found = from_object(usage)
            if found is not None:
                return found
        except (ValueError, UnicodeDecodeError):
            pass
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return from_object(body.get("usage")) if isinstance(body, dict) else None


def from_stream(tail: bytes) -> Usage | None:
    """The usage in a stream's last bytes as the client was sent them: the worker's last comment,
    else the last usage object among its events (`response.completed`'s, `message_delta`'s...)."""
    found = None
    for found in _COMMENT.finditer(tail):
        pass
    if found is not None:
        return int(found[1]), int(found[2]), int(found[3])
    for event in reversed(tail.split(b"\n\n")):
        if b'"usage"' not in event:
            continue
        for line in event.split(b"\n"):
            if line.startswith(b"data: {"):
                try:
                    data = json.loads(line[6:])
                except ValueError:
                    continue
                if isinstance(data, dict):
                    nested = data.get("response") if isinstance(data.get("response"), dict) else data.get("message")
                    usage = from_object(data.get("usage")) or (from_object(nested.get("usage")) if isinstance(nested, dict) else None)
                    if usage is not None:
                        return usage
    return None

