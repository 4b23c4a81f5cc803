"""What both services' aiohttp apps share: a refusal as an HTTP answer (`error_response`), and the
middleware that answers aiohttp's own refusals and a handler's unexpected failure in that shape
(`errors_as_json`). The bodies are `mtpstack.refusals`', in the error shape of the path's API family.

Not in the base layer: it imports aiohttp, which the services have and the config layer and the
base do not need. `tests/test_layout.py` lets the proxy, the worker and the CLI import it.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus

from aiohttp import hdrs, web

from mtpstack.endpoints import family_of
from mtpstack.refusals import error_body, family_status, internal_error, routing_refusal
from mtpstack.requestid import REQUEST_ID, request_id


def error_response(status: int, code: str, message: str, *, rid: str | None, param: str | None = None,
                   retry_after: int | None = None, family: str = "openai") -> web.Response:
    """A refusal in the error shape of the endpoint's API family (`mtpstack.refusals`), naming the
    request id and, for a client told to come back, when (`Retry-After`)."""
    headers = {REQUEST_ID: rid} if rid is not None else {}
    if retry_after is not None:
        headers[hdrs.RETRY_AFTER] = str(retry_after)
    status = family_status(status, code, family)
    return web.Response(status=status, body=json.dumps(error_body(status, code, message, param, family)).encode(),
                        content_type="application/json", headers=headers)


def errors_as_json(service: str):
    """The middleware of `service` (`proxy`, `worker`: its logger is `mtpstack.<service>`): aiohttp's
    own refusals (an unknown path, a wrong method: its plain-text 404 and 405) in the error shape, and
    an unexpected exception as a 500 naming the request id, logged once with its traceback. An answer
    already under way can be followed by nothing: its connection is cut (a client raises on the short
    body) instead of letting aiohttp log the failure again on its own."""
    log = logging.getLogger(f"mtpstack.{service}")

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            allowed = e.headers.get(hdrs.ALLOW)
            code, message = routing_refusal(e.status, request.method, request.path, allowed)
            status = HTTPStatus(e.status)
            rid = request_id(request.headers)  # a client's id, or a new one: minted only for a refusal here
        except Exception:
            rid = request_id(request.headers)
            log.exception("unexpected error in request %s", rid)
            if request.writer is not None and request.writer.output_size > 0:
                if request.transport is not None:
                    request.transport.close()
                return web.Response()
            (code, message), allowed, status = internal_error(service, rid), None, HTTPStatus.INTERNAL_SERVER_ERROR
        resp = error_response(status, code, message, rid=rid, family=family_of(request.path))
        if allowed is not None:
            resp.headers[hdrs.ALLOW] = allowed
        return resp

    return middleware
