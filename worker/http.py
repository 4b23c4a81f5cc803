"""The worker's HTTP conventions: the request id every answer carries, the largest body it reads,
and the error shape its refusals take (the endpoint's API family's, `mtpstack.refusals`), aiohttp's
own (404, 405) and failures included."""

from __future__ import annotations

import logging

from aiohttp import hdrs, web

from mtpstack import refusals
from mtpstack.endpoints import family_of
from mtpstack.refusals import error_body, internal_error, routing_refusal, shown_name

# The request id is shared with the proxy (`mtpstack.requestid`) so one id names a request in both logs;
# every worker module takes these two names from here.
from mtpstack.requestid import REQUEST_ID, request_id

__all__ = ["MAX_BODY_BYTES", "REQUEST_ID", "RETRY_AFTER", "ApiError", "bad_request", "body_too_large", "errors_as_json",
           "generation_failed", "model_not_found", "request_id"]

log = logging.getLogger("mtpstack.worker")

#: Largest request body the worker reads; the proxy's own limit (`proxy.maxBodyBytes`) is lower.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Seconds a rejected client is told to wait.
RETRY_AFTER = 1


class ApiError(Exception):
    """A refusal, answered in the error shape of the endpoint's API family (`mtpstack.refusals`, whose
    one rule gives its `type` by status); a 429 or 503 also tells the client when to retry."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def body(self, family: str = "openai") -> dict:
        return error_body(self.status, self.code, self.message, self.param, family)

    def response(self, rid: str | None = None, family: str = "openai") -> web.Response:
        headers = {hdrs.RETRY_AFTER: str(RETRY_AFTER)} if self.status in (429, 503, refusals.OVERLOADED) else {}
        if rid is not None:
            headers[REQUEST_ID] = rid
        return web.json_response(self.body(family), status=self.status, headers=headers)


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 `invalid_request`: the client's request is malformed, `param` naming the field."""
    return ApiError(400, "invalid_request", message, param)


def generation_failed(error, rid: str) -> ApiError:
    """A 500 naming the request, so the failure a client sees can be found in the worker's log."""
    return ApiError(500, "generation_failed", f"generation failed for request `{rid}`: {error}")


@web.middleware
async def errors_as_json(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp's own refusals (an unknown path, a wrong method) in OpenAI's error shape, and an
    unexpected exception as a 500 naming the request id, logged once with its traceback."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        allowed = e.headers.get(hdrs.ALLOW)
        refusal = ApiError(e.status, *routing_refusal(e.status, request.method, request.path, allowed))
        resp = refusal.response(request_id(request.headers), family_of(request.path))
    except Exception:
        rid = request_id(request.headers)
        log.exception("request %s: unexpected error", rid)
        if request.writer is not None and request.writer.output_size > 0:
            # The answer is under way and nothing can follow its first bytes: its connection is cut.
            if request.transport is not None:
                request.transport.close()
            return web.Response()
        return ApiError(500, *internal_error("worker", rid)).response(rid, family_of(request.path))
    if allowed is not None:
        resp.headers[hdrs.ALLOW] = allowed
    return resp


def model_not_found(served: str, asked: str) -> ApiError:
    """404 for a model this worker does not serve (a request's `model`, or `/v1/models/{id}`)."""
    return ApiError(404, "model_not_found", f"this worker serves `{served}`, not: `{shown_name(asked)}`", "model")


def body_too_large() -> ApiError:
    return ApiError(413, *refusals.body_too_large(MAX_BODY_BYTES))
