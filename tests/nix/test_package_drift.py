"""The Nix package's pins and import list against what they derive from, so the next drift fails
here rather than in an operator's `nixos-rebuild`: modules/pins.nix against requirements.lock and
pyproject.toml, requirements-nixpkgs.lock and modules/python-imports.json against what
`devkit.nix_package` computes from the source now."""

from __future__ import annotations

import json
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from devkit import nix_package

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.nix
FIX = "\n\nhint: run `python -m devkit.nix_package` and commit what it writes"


@pytest.fixture(scope="module")
def pins(nix) -> dict:
    return nix_package.pins()


def locked(name: str, platform: str | None = None) -> str:
    """The version requirements.lock pins `name` at (on `platform`, for a line with a marker)."""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(rf"{re.escape(name)}==([^ ;]+)\s*(?:;\s*(.*))?$", line)
        if m and (m.group(2) is None or platform is None or platform in m.group(2)):
            return m.group(1)
    raise AssertionError(f"requirements.lock pins no `{name}`")


def pyproject_requirements() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name: Requirement(d) for d in deps}


def lower_bound(requirement: Requirement) -> Version:
    (spec,) = [s for s in requirement.specifier if s.operator in (">=", "==")]
    return Version(spec.version)


def test_the_pinned_mlx_lm_is_the_locked_one(pins):
    assert pins["mlx-lm"]["version"] == locked("mlx-lm")


def test_the_pinned_metal_wheels_are_the_locked_mlx(pins):
    assert pins["mlx"]["version"] == locked("mlx", "darwin")
    assert pins["mlx-metal"]["version"] == locked("mlx-metal", "darwin")


def test_pyproject_admits_nixpkgs_versions_at_its_lower_bounds(pins):
    # The bounds the package's runtime-deps check applies are the versions the second venv tests.
    reqs = pyproject_requirements()
    assert lower_bound(reqs["llguidance"]) == Version(pins["nixpkgs"]["llguidance"])
    assert lower_bound(reqs["mlx"]) == Version(pins["nixpkgs"]["mlx"])
    assert reqs["mlx-lm"].specifier.contains(pins["mlx-lm"]["version"])


def test_requirements_nixpkgs_lock_is_current(pins):
    want = nix_package.nixpkgs_lock((ROOT / "requirements.lock").read_text(), pins)
    assert (ROOT / "requirements-nixpkgs.lock").read_text() == want, FIX


def test_requirements_nixpkgs_lock_installs_the_packages_versions(pins):
    text = (ROOT / "requirements-nixpkgs.lock").read_text()
    assert f"mlx-lm=={pins['mlx-lm']['version']}\n" in text
    assert f"mlx=={pins['nixpkgs']['mlx']} ; sys_platform == 'linux'\n" in text
    assert f"mlx-cpu=={pins['nixpkgs']['mlx']} ; sys_platform == 'linux'\n" in text
    assert f"llguidance=={pins['nixpkgs']['llguidance']}\n" in text


def test_the_import_list_is_current():
    assert json.loads((ROOT / "modules" / "python-imports.json").read_text()) == nix_package.python_imports(), FIX


def test_the_import_list_reaches_the_lazily_imported_engine():
    # generation.py imports the engine inside a function; the engine imports gated_delta.
    names = nix_package.python_imports()
    assert {"mtpstack.worker.loading", "mtpstack.worker.scheduler", "mtpstack.worker.caches", "mlx_lm.models.gated_delta", "llguidance"} <= set(names)
    assert "mtpstack.bench" not in names  # not run by a service


def test_a_function_level_import_is_followed_and_type_checking_ones_are_not(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import heavy\n"
        "def f():\n    from mtpstack.b import x\n    import mlx.core\n"
    )
    (pkg / "b.py").write_text("x = 1\n")
    dirs = {"mtpstack": pkg}
    found = nix_package.imports_of(pkg / "a.py", "mtpstack.a", dirs)
    assert found == {"typing", "mtpstack.b", "mlx.core"}


def test_every_third_party_module_comes_from_a_declared_dependency():
    # A module a service imports must come from pyproject's dependencies (or one of theirs):
    # the Nix package installs nothing else.
    reqs = pyproject_requirements()
    declared = {re.sub(r"[-_.]+", "-", n).lower() for n in reqs}
    for name in list(declared):
        try:
            declared |= {re.sub(r"[-_.]+", "-", Requirement(r).name).lower() for r in metadata.requires(name) or []}
        except metadata.PackageNotFoundError:
            pass
    providers = metadata.packages_distributions()
    modules = {n.split(".")[0] for n in nix_package.python_imports() if not n.startswith("mtpstack")}
    orphans = {m: providers.get(m) for m in modules
               if not {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(m, [])} & declared}  # fmt: skip
    assert orphans == {}


def test_each_macos_variant_pins_the_same_pythons_and_its_metal_runtime(pins):
    # modules/package.nix takes `macosVariant` ("14" by default) for both wheels; the modules take the
    # one with JACCL on a Mac that runs a jaccl rank (tests/nix/test_pinned_files.py checks the wheels).
    mlx, metal = pins["mlx"]["wheels"], pins["mlx-metal"]["wheels"]
    assert set(mlx) == set(metal) and "14" in mlx
    assert len({frozenset(w["hashes"]) for w in mlx.values()}) == 1  # every variant, every Python
    assert all(mlx[v]["platform"] == metal[v]["platform"] == f"macosx_{v}_0_arm64" for v in mlx)
    assert metal["14"]["jaccl"] is False and [v for v in metal if metal[v]["jaccl"]] == ["26"]


def test_the_extra_mlx_lm_skips_cover_the_linux_mlx_the_package_is_tested_with(pins):
    below = pins["mlx-lm"]["disabledTestPathsBelowMlx"]
    assert Version(pins["nixpkgs"]["mlx"]) < Version(below["version"]) <= Version(pins["mlx"]["version"])
    assert not set(below["paths"]) & set(pins["mlx-lm"]["disabledTestPaths"])
