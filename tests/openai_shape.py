"""Checks of the OpenAI error shape that the worker and the proxy answer alike (for the tests)."""

from __future__ import annotations

from devkit.raw_http import json_answer


def check_unknown_route(base_url: str, path: str, method: str, status: int, code: str) -> None:
    """`method path` is answered `status` in the OpenAI error shape: `code`, the path named in the
    message, a request id, and `Allow` on a 405."""
    got, headers, payload = json_answer(base_url + path, method, body=b"{}" if method == "POST" else None)
    assert (got, payload["error"]["code"], payload["error"]["type"]) == (status, code, "invalid_request_error"), payload
    assert path in payload["error"]["message"] and headers["X-Request-Id"]
    if status == 405:
        assert headers["Allow"]
