"""The one user-error type and its printer.

A command that refuses raises `UserError(message, hint)`; `mtpstack.cli.main` prints it
once with `print_error` and exits 1. The text follows uv's grammar: `error: MESSAGE` (a
value after a colon, code and paths in backticks, no trailing period), then, when there
is a fix, a blank line and `hint: HINT`. Everything goes to stderr: stdout is for data.

BASE layer: stdlib only, importable from every package.
"""

from __future__ import annotations

import sys
from typing import TextIO


class UserError(Exception):
    """A problem the user can fix: `message` says what is wrong, `hint` (optional) what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


def format_error(message: str, hint: str | None = None) -> str:
    """`error: MESSAGE`, and `hint: HINT` after a blank line when there is a hint."""
    return f"error: {message}" + (f"\n\nhint: {hint}" if hint else "")


def print_error(error: UserError | str, hint: str | None = None, *, file: TextIO | None = None) -> int:
    """Print a `UserError` (or a message and hint) to stderr; returns 1, the exit status of a refusal."""
    if isinstance(error, UserError):
        error, hint = error.message, error.hint
    print(format_error(error, hint), file=file or sys.stderr)
    return 1
