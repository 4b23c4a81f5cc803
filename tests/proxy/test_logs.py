"""The proxy's log formatter: one JSON object per line, whoever logs and whatever they log."""

from __future__ import annotations

import json
import logging

from aiohttp.http_exceptions import BadHttpMessage

from mtpstack.proxy.logs import JsonLines, MalformedHttpInOneLine


def record(msg: str, exc: BaseException | None = None, name: str = "mtpstack.proxy") -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, (), exc_info)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


def test_an_event_of_the_proxy_passes_through_as_it_is():
    line = JsonLines().format(record(json.dumps({"event": "request", "status": 200})))
    assert json.loads(line) == {"event": "request", "status": 200}


def test_an_exception_logged_anywhere_is_one_line_with_its_traceback_in_a_field():
    line = JsonLines().format(record("unexpected error in request %s" % "r1", raised(RecursionError("deep"))))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["event"] == "log" and entry["level"] == "error" and entry["error"] == "RecursionError: deep"
    assert entry["traceback"].startswith("Traceback") and "RecursionError: deep" in entry["traceback"]


def test_a_clients_malformed_http_keeps_the_parsers_error_and_drops_its_traceback():
    rec = record("Error handling request from %s", raised(BadHttpMessage("Invalid character in chunk size")), "aiohttp.server")
    rec.args = ("127.0.0.1",)
    assert MalformedHttpInOneLine().filter(rec)
    entry = json.loads(JsonLines().format(rec))
    assert "traceback" not in entry
    assert entry["message"].startswith("Error handling request from 127.0.0.1: BadHttpMessage: 400")
