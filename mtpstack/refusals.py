"""What both services answer when they refuse a request: one error body per API family, one rule
for the error `type` a status gets, and the refusal texts both services write.

A refusal is a status, a stable `code`, a message and (for a field's fault) the `param` it names.
`error_body` renders it in the shape of the endpoint's API family (`mtpstack.endpoints`: OpenAI's
`{"error": {message, type, code, param}}`, Anthropic's `{"type": "error", "error": {type, message}}`);
each family names the kinds of `error_kind` its own way. A new API family is one more renderer in
`ERROR_BODIES` and one more column in `ERROR_TYPES`, never a second status rule. The services wrap the body in one aiohttp response (`mtpstack.web.error_response`), also for
aiohttp's own refusals (`routing_refusal`) and a handler's unexpected failure (`internal_error`),
which both answer through one middleware (`mtpstack.web.errors_as_json`).
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

#: Longest part of a client's path repeated in a refusal.
SHOWN_PATH = 200
#: Longest part of a client's model name repeated in a refusal.
SHOWN_NAME = 100
#: A JSON body that parsed but is not an object.
NOT_AN_OBJECT = "the request body must be a JSON object"

#: Anthropic's status for an overloaded service; no `HTTPStatus` member.
OVERLOADED = 529


def error_kind(status: int) -> str:
    """What a refusal is, by its status: the one rule every family's error `type` follows."""
    if status == HTTPStatus.UNAUTHORIZED:
        return "authentication"
    if status == HTTPStatus.FORBIDDEN:
        return "permission"
    if status == HTTPStatus.NOT_FOUND:
        return "not_found"
    if status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:
        return "too_large"
    if status == HTTPStatus.TOO_MANY_REQUESTS:
        return "rate_limit"
    if status == OVERLOADED:
        return "overloaded"
    return "invalid_request" if status < 500 else "server"


#: Each API family's error `type` for each kind of `error_kind`. OpenAI's clients read only a few:
#: every other client fault is `invalid_request_error`, every server fault `server_error`.
ERROR_TYPES: dict[str, dict[str, str]] = {
    "openai": {
        "invalid_request": "invalid_request_error",
        "authentication": "authentication_error",
        "permission": "invalid_request_error",
        "not_found": "invalid_request_error",
        "too_large": "invalid_request_error",
        "rate_limit": "rate_limit_error",
        "overloaded": "server_error",
        "server": "server_error",
    },
    # Anthropic's documented error types (its Messages API).
    "anthropic": {
        "invalid_request": "invalid_request_error",
        "authentication": "authentication_error",
        "permission": "permission_error",
        "not_found": "not_found_error",
        "too_large": "request_too_large",
        "rate_limit": "rate_limit_error",
        "overloaded": "overloaded_error",
        "server": "api_error",
    },
}


def error_type(status: int, family: str = "openai") -> str:
    return ERROR_TYPES[family][error_kind(status)]


def _openai_body(status: int, code: str, message: str, param: str | None) -> dict:
    return {"error": {"message": message, "type": error_type(status, "openai"), "code": code, "param": param}}


def _anthropic_body(status: int, code: str, message: str, param: str | None) -> dict:
    """Anthropic's shape has no `param` nor `code`: the message starts with the field, as Anthropic's
    own do (`messages.0.content: ...`)."""
    text = f"{param}: {message}" if param else message
    return {"type": "error", "error": {"type": error_type(status, "anthropic"), "message": text}}


#: The error body of each API family, by the family's name (`Endpoint.family`).
ERROR_BODIES: dict[str, Callable[[int, str, str, str | None], dict]] = {"openai": _openai_body, "anthropic": _anthropic_body}
#: Where a family answers a refusal with a status of its own: Anthropic's clients (Claude Code
#: included) retry its 529 `overloaded_error`, honouring `retry-after`, for a full queue.
FAMILY_STATUS: dict[str, dict[str, int]] = {"anthropic": {"queue_full": OVERLOADED}}


def family_status(status: int, code: str, family: str = "openai") -> int:
    """The status a refusal with `code` is answered with in `family`'s API."""
    return FAMILY_STATUS.get(family, {}).get(code, status)


def error_body(status: int, code: str, message: str, param: str | None = None, family: str = "openai") -> dict:
    """A refusal as the API family's clients read it."""
    return ERROR_BODIES[family](status, code, message, param)


#: The SSE event name a family's stream error takes (Anthropic's clients read a named `error`
#: event); OpenAI's is a bare `data:` event.
STREAM_ERROR_EVENTS: dict[str, str] = {"anthropic": "error"}


def stream_error(api: str, status: int, code: str, message: str, sequence_number: int = 0,
                 family: str = "openai") -> tuple[str | None, dict]:
    """The last event of a stream that failed after its head went out, as (its SSE event name or None,
    its data), in the shape of its API (`Endpoint.api`): the Responses API an `error` event, `{"type":
    "error", "code", "message", "param", "sequence_number"}`, numbered after the stream's last; the
    others the family's error body, as its family names the event (`STREAM_ERROR_EVENTS`; OpenAI's
    and Anthropic's clients raise on it). The worker ends a failed generation this way, the proxy a
    stream its worker broke off."""
    if api == "responses":
        return "error", {"type": "error", "sequence_number": sequence_number, "code": code, "message": message,
                         "param": None}
    return STREAM_ERROR_EVENTS.get(family), error_body(status, code, message, None, family)


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


def body_too_large(limit: int) -> tuple[str, str]:
    """The error `code` and message of a 413: a body larger than `limit` bytes."""
    return "body_too_large", f"the request body is larger than the limit: {limit} bytes"


def shown_name(name: str) -> str:
    """A client's model name inside a refusal: whole when short, so an error never echoes a megabyte back."""
    return name if len(name) <= SHOWN_NAME else name[:SHOWN_NAME] + "..."
