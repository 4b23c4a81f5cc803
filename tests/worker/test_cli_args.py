"""`mtpstack worker`'s flags as the Nix module's examples write them."""

from __future__ import annotations

import pytest

from mtpstack.cli import build_parser


def parse(*flags: str):
    argv = ["worker", "--model", "/m", *flags]
    return build_parser(argv).parse_args(argv)


def test_the_log_level_takes_any_case_as_the_modules_example_writes_it():
    # modules/worker-options.nix's `extraArgs` example is `[ "--log-level" "debug" ]`.
    assert parse("--log-level", "debug").log_level == "DEBUG"
    assert parse("--log-level", "Warning").log_level == "WARNING"
    assert parse().log_level == "INFO"


def test_an_unknown_log_level_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as e:
        parse("--log-level", "loud")
    assert e.value.code == 2
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err
