"""The worker takes its draft-depth default and limit from the config model, not from a copy."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from mtpstack.validator.config import DEPTH_DEFAULT, DEPTH_MAX
from mtpstack.worker.cli import register


def _worker(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpstack", "worker", "--model", "/nonexistent", *flags],
                          capture_output=True, text=True, timeout=60)


def test_a_depth_beyond_the_configs_limit_is_refused_before_loading():
    run = _worker("--draft-depth", str(DEPTH_MAX + 1))
    assert run.returncode == 1
    assert f"`--draft-depth` must be between 0 and {DEPTH_MAX}: {DEPTH_MAX + 1}" in run.stderr


@pytest.mark.parametrize("entry", [f"code={DEPTH_MAX + 1}", "code=0"])
def test_a_class_depth_outside_the_configs_range_is_refused(entry):
    run = _worker("--draft-depth-map", entry)
    assert run.returncode == 1 and f"a depth from 1 to {DEPTH_MAX}" in run.stderr


def test_the_help_states_the_configs_default_and_limit():
    # The worker's own parser, in this process: what `mtpstack worker --help` prints.
    subparsers = argparse.ArgumentParser(prog="mtpstack").add_subparsers()
    register(subparsers)
    help_text = subparsers.choices["worker"].format_help()
    assert f"0 to {DEPTH_MAX} (default: {DEPTH_DEFAULT})" in " ".join(help_text.split())


def test_the_engine_refuses_a_depth_beyond_the_configs_limit():
    pytest.importorskip("mlx.core")
    from mtpstack.worker.loading import Engine

    with pytest.raises(ValueError, match=f"between 0 and {DEPTH_MAX}"):
        Engine.load("/nonexistent", "/nonexistent", draft_depth=DEPTH_MAX + 1)
