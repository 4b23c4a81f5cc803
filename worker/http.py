"""The worker's HTTP conventions: the request id every answer carries, the largest body it reads,
and its refusals (`ApiError`), answered as both services answer one (`mtpstack.web.error_response`:
the endpoint's API family's shape, `mtpstack.refusals`). aiohttp's own refusals (404, 405) and
failures are answered by both services' middleware, `mtpstack.web.errors_as_json`."""

from __future__ import annotations

from aiohttp import web

from mtpstack import refusals
from mtpstack.refusals import error_body, shown_name

# The request id is shared with the proxy (`mtpstack.requestid`) so one id names a request in both logs;
# every worker module takes these two names from here.
from mtpstack.requestid import REQUEST_ID, request_id
from mtpstack.web import error_response

__all__ = ["MAX_BODY_BYTES", "REQUEST_ID", "RETRY_AFTER", "ApiError", "bad_request", "body_too_large",
           "generation_failed", "model_not_found", "request_id"]

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
        retry = RETRY_AFTER if self.status in (429, 503, refusals.OVERLOADED) else None
        return error_response(self.status, self.code, self.message, rid=rid, param=self.param, retry_after=retry, family=family)


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 `invalid_request`: the client's request is malformed, `param` naming the field."""
    return ApiError(400, "invalid_request", message, param)


def generation_failed(error, rid: str) -> ApiError:
    """A 500 naming the request, so the failure a client sees can be found in the worker's log."""
    return ApiError(500, "generation_failed", f"generation failed for request `{rid}`: {error}")


def model_not_found(served: str, asked: str) -> ApiError:
    """404 for a model this worker does not serve (a request's `model`, or `/v1/models/{id}`)."""
    return ApiError(404, "model_not_found", f"this worker serves `{served}`, not: `{shown_name(asked)}`", "model")


def body_too_large() -> ApiError:
    return ApiError(413, *refusals.body_too_large(MAX_BODY_BYTES))
