"""The worker takes its draft-depth default and limit from the config model, not from a copy."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from mtpstack.validator import DEPTH_AUTO_MAX_DEFAULT, DEPTH_DEFAULT, DEPTH_MAX, parse_depth_map
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
    flat = " ".join(help_text.split())
    depth_help = flat[flat.index("--draft-depth DRAFT_DEPTH tokens"):flat.index("--draft-depth-map DRAFT_DEPTH_MAP depth")]
    assert f"0 to {DEPTH_MAX};" in depth_help and "`auto`" in depth_help and depth_help.endswith(f"(default: {DEPTH_DEFAULT}) ")
    assert f"the deepest an `auto` depth drafts; the head is loaded for it (default: {DEPTH_AUTO_MAX_DEFAULT})" in flat


def test_a_depth_that_is_neither_a_number_nor_auto_is_refused_naming_both():
    run = _worker("--draft-depth", "deep")
    assert run.returncode != 0 and "invalid depth (a number or `auto`) value: 'deep'" in run.stderr


def test_auto_is_taken_as_a_depth_and_in_a_class_map():
    subparsers = argparse.ArgumentParser(prog="mtpstack").add_subparsers()
    register(subparsers)
    args = subparsers.choices["worker"].parse_args(["--model", "/m", "--draft-depth", "AUTO", "--draft-depth-map", "code=auto,prose=2"])
    assert args.draft_depth == "auto" and parse_depth_map(args.draft_depth_map) == {"code": "auto", "prose": 2}


def test_the_engine_refuses_a_depth_beyond_the_configs_limit():
    pytest.importorskip("mlx.core")
    from mtpstack.worker.loading import Engine

    with pytest.raises(ValueError, match=f"between 0 and {DEPTH_MAX}"):
        Engine.load("/nonexistent", "/nonexistent", draft_depth=DEPTH_MAX + 1)


@pytest.mark.parametrize("flags", [("--draft-depth", "auto"), ("--draft-depth-map", "code=auto")])
def test_auto_without_a_drafter_is_refused_naming_the_flag_that_fixes_it(flags):
    run = _worker(*flags)
    assert run.returncode == 1 and "no drafter is loaded" in run.stderr and "--draft-model PATH" in run.stderr
