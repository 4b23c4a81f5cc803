"""The proxy's log: one JSON object per line on stderr, whoever logs.

The proxy's own events are already JSON objects (`{"event": "request", ...}`) and pass
through as they are. Everything else, aiohttp's own errors for malformed HTTP and any
`log.exception` included, becomes `{"event": "log", "level", "logger", "message"}`,
with a traceback, where one is logged, as a string field, never as extra lines. A client's
malformed HTTP is logged with the parser's error, without its traceback.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from aiohttp.http_exceptions import HttpProcessingError


class MalformedHttpInOneLine(logging.Filter):
    """aiohttp logs a client's malformed HTTP (already answered 400) with its parser's
    traceback: the client's mistake, not the server's, so the error's own text says enough.
    Failures of the server itself keep their tracebacks. Used by the worker too."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {' '.join(str(error).split())}"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        entry = None
        if message.startswith("{"):
            try:
                entry = json.loads(message)
            except ValueError:
                entry = None
        if not isinstance(entry, dict):
            entry = {"event": "log", "level": record.levelname.lower(), "logger": record.name, "message": message}
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
            entry["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        elif record.stack_info:
            entry["traceback"] = record.stack_info
        return json.dumps(entry)


def configure(level: int = logging.INFO) -> logging.Handler:
    """Route every logger of the process to stderr as JSON lines; returns the handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiohttp.server").addFilter(MalformedHttpInOneLine())
    return handler
