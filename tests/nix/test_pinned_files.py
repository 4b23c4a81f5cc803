"""The files modules/pins.nix pins, as PyPI serves them (`python -m devkit.nix_pins fetch`, which
scripts/test runs): the hashes, the platforms, JACCL in the macOS 26 build of mlx-metal only, the
frontend wheels' pairing with it, and every test path the mlx-lm check phase skips present in the
sdist. Skips where the files were not fetched (no network); fails so in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devkit import nix_pins
from tests.skips import require

pytestmark = pytest.mark.nix


@pytest.fixture(scope="module")
def pins(nix) -> dict:
    return nix_pins.pins()


@pytest.fixture(scope="module")
def fetched(pins) -> Path:
    folder = Path(os.environ.get("MTPSTACK_NIX_PINS_DIR", nix_pins.DEFAULT_DIR))
    missing = [f.filename for f in nix_pins.pinned_files(pins) if not (folder / f.filename).is_file()]
    if missing:
        require(f"the pinned files are not in {folder} (`python -m devkit.nix_pins fetch`, run by scripts/test): {', '.join(missing)}")
    return folder


def test_every_pinned_file_has_its_pinned_hash(pins, fetched):
    got = {f.filename: nix_pins.sri_sha256(fetched / f.filename) for f in nix_pins.pinned_files(pins)}
    assert got == {f.filename: f.hash for f in nix_pins.pinned_files(pins)}


def test_every_pinned_wheel_is_built_for_its_pinned_platform(pins, fetched):
    for f in nix_pins.pinned_files(pins):
        if f.platform is not None:
            tags = [line.split(":", 1)[1].strip() for line in nix_pins.wheel_metadata(fetched / f.filename, "WHEEL").splitlines()
                    if line.startswith("Tag:")]  # fmt: skip
            assert tags and all(t.endswith("-" + f.platform) for t in tags), (f.filename, tags)


def test_only_the_mlx_metal_builds_pinned_with_jaccl_carry_it(pins, fetched):
    # MLX compiles JACCL for a deployment target of 26.2 or later (mlx/distributed/jaccl/CMakeLists.txt).
    metal = [f for f in nix_pins.pinned_files(pins) if f.jaccl is not None]
    assert {f.variant: nix_pins.libmlx_has_jaccl(fetched / f.filename) for f in metal} == {f.variant: f.jaccl for f in metal}
    assert {f.jaccl for f in metal} == {True, False}  # a variant with JACCL, and the default without


def test_each_mlx_wheel_requires_the_pinned_mlx_metal(pins, fetched):
    want = f"Requires-Dist: mlx-metal=={pins['mlx-metal']['version']}"
    for f in nix_pins.pinned_files(pins):
        if f.filename.startswith("mlx-"):
            metadata = nix_pins.wheel_metadata(fetched / f.filename, "METADATA").splitlines()
            assert any(line.startswith(want + ";") for line in metadata), f.filename


def test_every_test_path_the_mlx_lm_check_skips_is_in_the_pinned_sdist(pins, fetched):
    lm = pins["mlx-lm"]
    files = nix_pins.sdist_files(fetched / f"mlx_lm-{lm['version']}.tar.gz")
    paths = lm["disabledTestPaths"] + lm["disabledTestPathsBelowMlx"]["paths"]
    assert nix_pins.unmatched_test_paths(paths, files) == []


def test_a_test_path_the_sdist_lacks_is_caught(pins, fetched):
    files = nix_pins.sdist_files(fetched / f"mlx_lm-{pins['mlx-lm']['version']}.tar.gz")
    assert nix_pins.unmatched_test_paths(["tests/test_gone.py", "tests/test_gone.py::T::t", "tests/test_models.py::T"], files) == [
        "tests/test_gone.py", "tests/test_gone.py::T::t",
    ]  # fmt: skip
