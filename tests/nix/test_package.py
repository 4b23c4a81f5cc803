"""modules/package.nix evaluated with nixpkgs' `lib` (NIXPKGS_LIB) and a stand-in `python3`
(tests/nix/stub-python3.nix): which mlx and mlx-lm the package takes per platform, pinned by hash
as modules/pins.nix says; its dependencies are pyproject.toml's; it refuses a nixpkgs whose mlx is
older than the tested one, or which lacks a dependency, with messages that say what to change."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUB = Path(__file__).with_name("stub-python3.nix")
pytestmark = [pytest.mark.nix, pytest.mark.nixpkgs_lib]
CPU_ONLY = "workers on aarch64-darwin run mlx on the CPU only"
SYSTEMS = ["x86_64-linux", "aarch64-linux", "aarch64-darwin"]


def evaluate(nixh, nixpkgs_lib: Path, system: str, package_args: str = "{ }", **stub: str) -> subprocess.CompletedProcess:
    """The package's arguments to buildPythonApplication, reduced to JSON, on `system`;
    `stub` are the stand-in's arguments as Nix expressions (e.g. withBin="false"),
    `package_args` more arguments of modules/package.nix (e.g. `{ macosVariant = "26"; }`)."""
    stub_args = " ".join(f"{k} = {v};" for k, v in stub.items())
    expr = f"""
      let
        lib = import {nixpkgs_lib};
        python3 = import {STUB} {{ inherit lib; {stub_args} }};
        stdenv.hostPlatform = {{
          isDarwin = lib.hasSuffix "-darwin" "{system}";
          isAarch64 = lib.hasPrefix "aarch64-" "{system}";
        }};
        fetchPypi = args: {{ fetchPypi = args; }};
        app = import {ROOT / "modules" / "package.nix"} ({{ inherit lib stdenv python3 fetchPypi; }} // {package_args});
        names = map (p: p.pname);
        mlxLm = app.passthru.mlx-lm;
        metal = app.passthru.python.pkgs.mlx-metal or null;
      in {{
        mlx = {{
          inherit (app.passthru.mlx) pname version;
          src = app.passthru.mlx.src or null;
          disabled = app.passthru.mlx.disabled or false;
        }};
        mlxMetal = if metal == null then null else metal.version;
        mlxMetalSrc = if metal == null then null else metal.src or null;
        inherit (app.passthru) jaccl macosVariant;
        mlxLm = {{
          inherit (mlxLm) version src disabledTestPaths;
          build-system = names mlxLm.build-system;
          dependencies = map (d: d.pname or d) mlxLm.dependencies;
        }};
        dependencies = names app.dependencies;
        inherit (app) pythonImportsCheck;
        inherit (app.passthru) dependencyNames;
      }}
    """
    return subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", "-E", expr],
                          capture_output=True, text=True, env=nixh.env(), timeout=60)  # fmt: skip


def package(nixh, nixpkgs_lib, system, package_args="{ }", **stub) -> tuple[dict, str]:
    proc = evaluate(nixh, nixpkgs_lib, system, package_args, **stub)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def pins(nixh) -> dict:
    return nixh.eval(file=ROOT / "modules" / "pins.nix")


def pyproject_dependency_names() -> list[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", d).group(1)).lower() for d in deps]
    return sorted(set(names))


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_dependencies_are_pyprojects_on_every_platform(nixh, nixpkgs_lib, system):
    got, _ = package(nixh, nixpkgs_lib, system)
    assert sorted(got["dependencyNames"]) == pyproject_dependency_names()
    # Each is the package set's own (mlx the one the platform takes).
    assert sorted(got["dependencies"]) == sorted(
        "mlx-bin" if n == "mlx" and system == "aarch64-darwin" else n for n in got["dependencyNames"]
    )
    assert "llguidance" in got["dependencies"]


@pytest.mark.parametrize("system", SYSTEMS)
def test_mlx_lm_is_the_pinned_sdist_on_every_platform(nixh, nixpkgs_lib, pins, system):
    got, _ = package(nixh, nixpkgs_lib, system)
    lm = got["mlxLm"]
    assert lm["version"] == pins["mlx-lm"]["version"]
    assert lm["src"] == {"fetchPypi": {"pname": "mlx_lm", "version": pins["mlx-lm"]["version"], "hash": pins["mlx-lm"]["hash"]}}
    assert "setuptools-scm" in lm["build-system"]  # the sdist's version comes through it
    assert "sentencepiece" in lm["dependencies"]
    # nixpkgs' own disabled tests are kept, the one new file that needs Metal added.
    assert {"tests/test_losses.py", "tests/test_muse_spark.py"} <= set(lm["disabledTestPaths"])


@pytest.mark.parametrize(("system", "mlx", "older"), [
    ("x86_64-linux", "0.31.2", True), ("aarch64-linux", "0.32.0", False), ("aarch64-darwin", "0.31.2", False),
])  # fmt: skip
def test_mlx_lm_skips_the_pinned_sdists_own_list_and_more_below_mlx_0_32(nixh, nixpkgs_lib, pins, system, mlx, older):
    # nixpkgs' list follows nixpkgs' mlx-lm (the stand-in's is one path that 0.32.2's sdist lacks); the
    # pinned sdist's own list replaces it, so no path of another version can abort pytestCheckHook.
    got, _ = package(nixh, nixpkgs_lib, system, mlxVersion=f'"{mlx}"', mlxLmVersion='"0.33.0"')
    below = pins["mlx-lm"]["disabledTestPathsBelowMlx"]
    # aarch64-darwin: the Metal wheels (0.32.4) whatever nixpkgs' own mlx is.
    assert got["mlxLm"]["disabledTestPaths"] == pins["mlx-lm"]["disabledTestPaths"] + (below["paths"] if older else [])


@pytest.mark.parametrize("python", ["3.12", "3.13", "3.14"])
@pytest.mark.parametrize("variant", ["14", "26"])
def test_apple_silicon_takes_the_pinned_metal_wheels(nixh, nixpkgs_lib, pins, python, variant):
    args = "{ }" if variant == "14" else f'{{ macosVariant = "{variant}"; }}'  # "14" is the default
    got, stderr = package(nixh, nixpkgs_lib, "aarch64-darwin", args, pythonVersion=f'"{python}"')
    dist = "cp" + python.replace(".", "")
    wheels, metal = pins["mlx"]["wheels"][variant], pins["mlx-metal"]["wheels"][variant]
    assert got["mlx"]["pname"] == "mlx-bin"
    assert got["mlx"]["version"] == pins["mlx"]["version"] == got["mlxMetal"]
    assert got["mlx"]["src"]["fetchPypi"] == {
        "pname": "mlx", "version": pins["mlx"]["version"], "platform": wheels["platform"],
        "dist": dist, "python": dist, "abi": dist, "format": "wheel", "hash": wheels["hashes"][python],
    }  # fmt: skip
    assert got["mlxMetalSrc"]["fetchPypi"]["platform"] == metal["platform"] == f"macosx_{variant}_0_arm64"
    assert got["mlxMetalSrc"]["fetchPypi"]["hash"] == metal["hash"]
    # nixpkgs' bin.nix disables itself for a Python its own wheel list lacks (3.12 at mlx 0.31.2).
    assert got["mlx"]["disabled"] is False
    # Only the macOS 26 build has MLX's JACCL backend.
    assert (got["jaccl"], got["macosVariant"]) == (variant == "26", variant)
    assert CPU_ONLY not in stderr


def test_a_python_without_a_pinned_wheel_names_the_file_to_add_it_to(nixh, nixpkgs_lib):
    proc = evaluate(nixh, nixpkgs_lib, "aarch64-darwin", pythonVersion='"3.15"')
    assert proc.returncode != 0
    assert "not for this nixpkgs' python3 (3.15)" in proc.stderr
    assert 'add its hash to `mlx.wheels."14".hashes` in modules/pins.nix' in proc.stderr


def test_an_unknown_macos_variant_names_the_ones_pinned(nixh, nixpkgs_lib):
    proc = evaluate(nixh, nixpkgs_lib, "aarch64-darwin", '{ macosVariant = "15"; }')
    assert proc.returncode != 0
    assert "pins the Metal wheels of mlx for the macOS variants 14, 26, not `15`" in proc.stderr
    assert 'hint: pass `macosVariant` as one of "14", "26"' in proc.stderr


@pytest.mark.parametrize("system", ["x86_64-linux", "aarch64-linux"])
def test_the_source_build_of_mlx_has_no_jaccl(nixh, nixpkgs_lib, pins, system):
    got, _ = package(nixh, nixpkgs_lib, system, '{ macosVariant = "26"; }', mlxVersion=f'"{pins["nixpkgs"]["mlx"]}"')
    assert (got["jaccl"], got["macosVariant"]) == (False, None)


def test_apple_silicon_without_mlx_bin_evaluates_on_the_cpu_build_and_says_so(nixh, nixpkgs_lib):
    got, stderr = package(nixh, nixpkgs_lib, "aarch64-darwin", withBin="false")
    assert got["mlx"]["pname"] == "mlx"
    assert CPU_ONLY in stderr


@pytest.mark.parametrize("system", ["x86_64-linux", "aarch64-linux"])
def test_linux_takes_nixpkgs_source_build_never_the_mac_wheel(nixh, nixpkgs_lib, pins, system):
    got, stderr = package(nixh, nixpkgs_lib, system, mlxVersion=f'"{pins["nixpkgs"]["mlx"]}"')
    assert (got["mlx"]["pname"], got["mlx"]["version"]) == ("mlx", pins["nixpkgs"]["mlx"])
    assert got["mlxMetal"] == "0.32.0"  # nixpkgs' own, untouched off the Mac
    assert CPU_ONLY not in stderr


def test_linux_refuses_an_mlx_older_than_the_tested_one(nixh, nixpkgs_lib, pins):
    proc = evaluate(nixh, nixpkgs_lib, "x86_64-linux", mlxVersion='"0.30.1"')
    assert proc.returncode != 0
    assert f"this nixpkgs' mlx is 0.30.1, older than {pins['nixpkgs']['mlx']}" in proc.stderr
    assert "set `services.mtpstack.package`" in proc.stderr


def test_a_dependency_nixpkgs_lacks_is_named(nixh, nixpkgs_lib):
    proc = evaluate(nixh, nixpkgs_lib, "x86_64-linux", missing='[ "llguidance" ]')
    assert proc.returncode != 0
    assert "pyproject.toml requires `llguidance`, which this nixpkgs' python3Packages does not carry" in proc.stderr


def test_the_import_check_is_the_derived_list(nixh, nixpkgs_lib):
    got, _ = package(nixh, nixpkgs_lib, "x86_64-linux")
    assert got["pythonImportsCheck"] == json.loads((ROOT / "modules" / "python-imports.json").read_text())
