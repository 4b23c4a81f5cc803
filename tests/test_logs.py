"""The services' log: one JSON object per line, whoever logs and whatever they log, rendered as plain text for a person."""

from __future__ import annotations

import json
import logging

from aiohttp.http_exceptions import BadHttpMessage

from mtpstack.logs import JsonLines, MalformedHttpInOneLine, render, render_line


def record(msg: str, exc: BaseException | None = None, name: str = "mtpstack.proxy") -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, (), exc_info)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


def test_an_event_of_the_proxy_passes_through_as_it_is_after_its_time():
    rec = record(json.dumps({"event": "request", "status": 200}))
    rec.created = 1796067901.1234
    line = JsonLines().format(rec)
    assert json.loads(line) == {"time": "2026-11-30T19:45:01.123Z", "event": "request", "status": 200}
    assert line.startswith('{"time": ')


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


def test_a_logged_error_reads_as_the_cli_writes_its_own_with_the_traceback_below():
    line = JsonLines().format(record("generation failed", raised(RecursionError("deep"))))
    text = render_line(line)
    assert text.startswith("error: generation failed\nTraceback")
    assert text.rstrip().endswith("RecursionError: deep")


def test_an_info_line_reads_as_its_message_alone():
    rec = logging.LogRecord("mtpstack.worker", logging.INFO, __file__, 1, "listening on %s", ("http://127.0.0.1:8000",), None)
    assert render_line(JsonLines().format(rec)) == "listening on http://127.0.0.1:8000"


def test_an_event_reads_as_its_name_and_fields():
    line = json.dumps({"event": "worker_health", "worker": "w0", "healthy": False, "detail": "/health answered 503"})
    assert render_line(line) == 'worker_health: worker=w0 healthy=false detail="/health answered 503"'


def test_lines_that_are_not_json_objects_are_shown_as_they_are():
    # mlx_lm.server logs plain text, and a crashing interpreter writes its traceback as it is.
    lines = ["INFO:root:Starting httpd at 127.0.0.1 on port 8080...", "[1, 2]", "{not json", ""]
    assert render(lines) == "\n".join(lines)
