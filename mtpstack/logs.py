"""The services' log: one JSON object per line on stderr, whoever logs; and its plain-text rendering.

`configure` is the one logging setup of both services (`mtpstack proxy` and `mtpstack worker`).
Their own events that are already JSON objects (`{"event": "request", ...}`) pass through as
they are, after a `time` field (RFC 3339, UTC, milliseconds) that every line carries first. Everything else, aiohttp's own errors for malformed HTTP and any `log.exception`
included, becomes `{"event": "log", "level", "logger", "message"}`, with a traceback, where one
is logged, as a string field, never as extra lines. A client's malformed HTTP is logged with the
parser's error, without its traceback.

What a person reads (`mtpstack up`'s progress and the log tail it prints when a start fails) is
`render`ed from those lines; a line that is not such an object (`mlx_lm.server` logs plain text)
is shown as it is.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import traceback
from datetime import datetime, timezone
from typing import Iterable

#: Levels a rendered line names in front of its message (`error: ...`), as the CLI writes its own.
NAMED_LEVELS = frozenset({"warning", "error", "critical"})


def _malformed_http(error: BaseException | None) -> bool:
    """aiohttp's parser error (`aiohttp.http_exceptions.HttpProcessingError` or a subclass), told by
    its class names so that this base module imports nothing but the standard library."""
    return error is not None and any(c.__name__ == "HttpProcessingError" and c.__module__.startswith("aiohttp")
                                     for c in type(error).__mro__)


class MalformedHttpInOneLine(logging.Filter):
    """aiohttp logs a client's malformed HTTP (already answered 400) with its parser's
    traceback: the client's mistake, not the server's, so the error's own text says enough.
    Failures of the server itself keep their tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if _malformed_http(error):
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {' '.join(str(error).split())}"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


#: `extra` for a message that is `json.dumps` of a dict with at least one key, written by the service
#: itself (the proxy's line per request): it goes out as it is after its time, not parsed again.
EVENT = {"mtpstack_event": True}


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if record.__dict__.get("mtpstack_event") and not record.exc_info and not record.stack_info:
            return '{"time": "' + timestamp(record.created) + '", ' + record.getMessage()[1:]
        message = record.getMessage()
        entry = _event(message)
        if entry is None:
            entry = {"event": "log", "level": record.levelname.lower(), "logger": record.name, "message": message}
        # When it happened, first: RFC 3339 in UTC to the millisecond (a launchd log file has no other clock).
        entry = {"time": timestamp(record.created), **entry}
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
            entry["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        elif record.stack_info:
            entry["traceback"] = record.stack_info
        return json.dumps(entry)


def timestamp(created: float) -> str:
    """`2026-11-30T19:45:01.123Z`: a record's creation time as the `time` field writes it (the
    second's text made once a second: a line per request costs no date arithmetic)."""
    global _second
    frac, whole = math.modf(created)  # as `datetime.fromtimestamp` rounds
    whole, us = int(whole), round(frac * 1_000_000)
    if us >= 1_000_000:
        whole, us = whole + 1, us - 1_000_000
    if _second[0] != whole:
        _second = (whole, datetime.fromtimestamp(whole, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{_second[1]}.{us // 1000:03d}Z"


_second: tuple[int, str] = (-1, "")


def configure(level: int | str = logging.INFO) -> logging.Handler:
    """Route every logger of the process to stderr as JSON lines; returns the handler."""
    # Nothing a line shows is looked up per record: not the calling frame, thread or process
    # (the logging HOWTO's "Optimization": each costs a lookup on every record).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # type: ignore[attr-defined]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiohttp.server").addFilter(MalformedHttpInOneLine())
    return handler


def render_line(line: str) -> str:
    """One log line as a person reads it: `error: message` (the level named from warnings up),
    the traceback below it; another event as `event: key=value ...`; anything else unchanged."""
    entry = _event(line.strip())
    if entry is None:
        return line.rstrip("\n")
    fields = dict(entry)
    fields.pop("time", None)  # the person reading is watching it happen
    event = fields.pop("event", None)
    tb = fields.pop("traceback", None)
    if event == "log":
        level = fields.get("level")
        text = (f"{level}: " if level in NAMED_LEVELS else "") + str(fields.get("message", ""))
    else:
        text = (f"{event}: " if event is not None else "") + " ".join(f"{k}={_plain(v)}" for k, v in fields.items())
    return text + ("\n" + tb.rstrip("\n") if tb else "")


def render(lines: Iterable[str]) -> str:
    """Log lines (raw, as the services wrote them) as plain text."""
    return "\n".join(render_line(line) for line in lines)


def _event(text: str) -> dict | None:
    if not text.startswith("{"):
        return None
    try:
        entry = json.loads(text)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _plain(value) -> str:
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return value
    return json.dumps(value)
