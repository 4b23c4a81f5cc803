"""The reference implementation (mlx-vlm, test-only) for the differential tests.

`scripts/test` installs it (`requirements-reference.lock`), so in CI (`CI` set, as `.ci/run` sets it)
a missing reference fails the test instead of skipping it silently. The one exception is the second
virtualenv of `scripts/test-nixpkgs-pins`, which holds the Nix package's versions only and says so
with `MTPSTACK_WITHOUT_REFERENCE=1`.
"""

from __future__ import annotations

import importlib
import os

import pytest

from tests.skips import require


def import_reference(module: str):
    """`module` of the reference, or a skip (outside CI) / a failure (in CI) naming the fix."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        message = f"the reference implementation is missing ({e}): scripts/test installs it (requirements-reference.lock)"
        if os.environ.get("MTPSTACK_WITHOUT_REFERENCE"):
            pytest.skip(message, allow_module_level=True)
        require(message, allow_module_level=True)
