"""What the proxy checks of a forwarded request before it is admitted: its body read whole within
the client deadline and under `proxy.maxBodyBytes`, parsed as an object naming a served model, the
slots its choices take, and what a worker's backend would silently ignore. Each refusal is a
`Rejected` the app answers (`mtpstack.proxy.app`)."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

from aiohttp import web

from mtpstack.endpoints import Endpoint
from mtpstack.proxy.admission import ModelAdmission, Rejected
from mtpstack.proxy.deadline import deadline_of
from mtpstack.proxy.state import ProxyState
from mtpstack.refusals import NOT_AN_OBJECT, body_too_large, shown_name
from mtpstack.validator import BodyError, parse_json_body

#: Error code of a request that did not arrive whole within `proxy.timeouts.clientSeconds`.
CLIENT_TIMEOUT = "client_timeout"


def not_served(state: ProxyState, model: str) -> str:
    served = ", ".join(f"`{m}`" for m in state.admissions) or "none"
    return f"model `{shown_name(model)}` is not served here; served models: {served}"


async def read_body(request: web.Request, limit: int, client_seconds: float) -> bytes:
    too_large = Rejected(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, *body_too_large(limit))
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    content = request.content
    if content.is_eof():  # the whole body came with the head (most requests): no deadline to arm
        whole = content.read_nowait()
        if len(whole) > limit:
            raise too_large
        return whole
    body = bytearray()
    try:
        async with asyncio.timeout_at(deadline_of(request, client_seconds)):
            async for chunk in request.content.iter_any():
                body += chunk
                if len(body) > limit:
                    raise too_large
    except TimeoutError:
        raise Rejected(
            HTTPStatus.REQUEST_TIMEOUT, CLIENT_TIMEOUT,
            f"the request did not arrive whole within {client_seconds:g} s (`proxy.timeouts.clientSeconds`)",
        ) from None
    return bytes(body)


def parse(body: bytes, state: ProxyState) -> tuple[dict, str]:
    try:
        payload = parse_json_body(body)
    except BodyError as e:
        raise Rejected(HTTPStatus.BAD_REQUEST, "invalid_request", str(e)) from None
    if not isinstance(payload, dict):
        raise Rejected(HTTPStatus.BAD_REQUEST, "invalid_request", NOT_AN_OBJECT)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise Rejected(HTTPStatus.BAD_REQUEST, "invalid_request", "the request has no `model`")
    if model not in state.admissions:
        raise Rejected(HTTPStatus.NOT_FOUND, "model_not_found", not_served(state, model))
    return payload, model


def choices(payload: dict, endpoint: Endpoint, admission: ModelAdmission) -> int:
    """The slots a request takes on its worker: one per choice (`n`, on the endpoints that take it), since
    each choice is a row of the worker's batch. A malformed `n` counts one: the worker refuses it."""
    n = payload.get("n")
    if not endpoint.choices or isinstance(n, bool) or not isinstance(n, int) or n <= 1:
        return 1
    if n > admission.widest:
        raise Rejected(HTTPStatus.BAD_REQUEST, "unsupported_parameter",
                       f"`n` may be at most the batch width of model `{admission.model}`'s widest worker "
                       f"({admission.widest}): each choice is a row of the batch: {n}")
    return n


def _ignored_field(payload: dict) -> str | None:
    """A field `mlx_lm.server` 0.32 accepts and silently ignores, whose answer would then differ in kind."""
    choice = payload.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        return "tool_choice"
    fmt = payload.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        return "response_format"
    return None


def refuse_what_backends_ignore(state: ProxyState, admission: ModelAdmission, endpoint: Endpoint, payload: dict, model: str) -> None:
    """Refused before admission, so the answer never depends on which worker would have been picked."""
    for u in admission.upstreams:
        backend = state.config.workers[u.name].backend
        if backend == "native":
            continue
        if endpoint.native_only:
            raise Rejected(
                HTTPStatus.BAD_REQUEST, "unsupported_endpoint",
                f"`{endpoint.path}` is not served for model `{model}`: its worker `{u.name}` runs the `{backend}` backend, "
                f"which has no {endpoint.title}; use `/v1/chat/completions`",
            )
        if (field := _ignored_field(payload)) is not None:
            raise Rejected(
                HTTPStatus.BAD_REQUEST, "unsupported_parameter",
                f"`{field}` cannot be honoured for model `{model}`: its worker `{u.name}` runs the `{backend}` backend, "
                "which ignores it",
            )

