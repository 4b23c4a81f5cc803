"""Fixtures every test folder shares: the tiny real model pairs, built once per run (seed 0).

Session-scoped and shared, so a test must not change their files: copy them first
(`tests/worker/conftest.py`'s `pair_copier`). Also the run's skip ledger (`tests/skips.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config) -> None:
    from tests.skips import SkipLedger  # the skips grouped by reason at the end; in CI, unexpected ones fail the run

    config.pluginmanager.register(SkipLedger(), "skip-ledger")


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A random qwen3 target and an early-exit qwen3 draft model (`devkit.demo.tiny`)."""
    from devkit.demo.tiny import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def hybrid_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny Qwen3.5-family hybrid target (gated-delta + full attention) and its MTP head folder."""
    from devkit.demo.tiny_hybrid import build_tiny_hybrid_pair

    return build_tiny_hybrid_pair(tmp_path_factory.mktemp("hybrid"), seed=0)


@pytest.fixture(scope="session")
def clients_python() -> Path:
    """The interpreter of the client libraries' own virtualenv (`.venv-clients`: the Anthropic SDK and
    the other clients pin their own versions); skipped without it, a failure under CI."""
    venv = Path(os.environ.get("MTPSTACK_CLIENTS_VENV", Path(__file__).resolve().parents[1] / ".venv-clients"))
    python = venv / "bin" / "python"
    if not python.exists():
        from tests.skips import require

        require(f"the client libraries' virtualenv is missing ({venv}): run scripts/bootstrap-clients")
    return python
