"""The one user-error type and printer: uv's grammar, printed once by `mtpstack.cli.main`."""

from __future__ import annotations

import argparse

from mtpstack import cli
from mtpstack.bench.report import ResultsError
from mtpstack.bench.sweep import SweepError
from mtpstack.errors import UserError, format_error, print_error
from mtpstack.proxy.auth import ApiKeysError
from mtpstack.status import StatusError
from mtpstack.up import UpError
from mtpstack.validator.source import Unreadable
from mtpstack.worker.proof import ProofError


def test_an_error_with_a_hint_puts_the_hint_after_a_blank_line():
    assert format_error("no such file: `x`", "pass another") == "error: no such file: `x`\n\nhint: pass another"
    assert format_error("no such file: `x`") == "error: no such file: `x`"


def test_the_printer_writes_to_stderr_and_returns_the_refusal_status(capsys):
    assert print_error(UserError("bad: `1`", "use `2`")) == 1
    assert print_error("bad: `1`") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: bad: `1`\n\nhint: use `2`\nerror: bad: `1`\n"


def test_every_command_error_with_a_hint_is_the_one_type():
    for kind in (UpError, StatusError, SweepError, ResultsError, ProofError, ApiKeysError, Unreadable):
        assert issubclass(kind, UserError), kind


def test_main_prints_a_user_error_a_command_raises_once(monkeypatch, capsys):
    def command(args: argparse.Namespace) -> int:
        raise StatusError("no run found: `x`", "start one")

    def build_parser(argv):
        parser = argparse.ArgumentParser()
        parser.set_defaults(func=command)
        return parser

    monkeypatch.setattr(cli, "build_parser", build_parser)
    assert cli.main([]) == 1
    assert capsys.readouterr().err == "error: no run found: `x`\n\nhint: start one\n"
