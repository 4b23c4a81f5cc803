"""What both services answer, in OpenAI's error shape, where aiohttp would answer in plain text:
a request its router refuses (an unknown path, a wrong method) and a handler's unexpected failure.
Each service wraps these in its own error body (`mtpstack.worker.http`, `mtpstack.proxy.http`).
"""

from __future__ import annotations

from http import HTTPStatus

#: Longest part of a client's path repeated in a refusal.
SHOWN_PATH = 200


def routing_refusal(status: int, method: str, path: str, allowed: str | None) -> tuple[str, str]:
    """The error `code` and message for aiohttp's own refusal of `method path` with `status`."""
    what = f"`{method} {path[:SHOWN_PATH]}`"
    known = HTTPStatus(status)
    if known == HTTPStatus.NOT_FOUND:
        return "not_found", f"no such endpoint: {what}"
    if known == HTTPStatus.METHOD_NOT_ALLOWED:
        return "method_not_allowed", f"the method is not allowed here: {what}; allowed: {allowed or 'none'}"
    return known.name.lower(), f"{known.phrase.lower()}: {what}"


def internal_error(service: str, rid: str) -> tuple[str, str]:
    """The error `code` and message of a 500: the request id finds the one log line with the traceback."""
    return "internal_error", f"the {service} failed on request `{rid}`"
