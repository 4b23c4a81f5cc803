"""`nix flake check` of this repository's flake, offline: nixpkgs is replaced by
a stand-in built from nixpkgs' `lib` (tests/nix/stub-nixpkgs.nix) whose package
is this test run's own Python, so the flake's checks run the real validator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nix, pytest.mark.nixpkgs_lib]
#: For the builds: the stand-in's builders run /bin/sh, which Nix's sandbox (on by
#: default where no /etc/nix/nix.conf says otherwise) does not provide.
BUILD_NIX_CONFIG = "experimental-features = nix-command flakes\nsubstituters =\nbuild-users-group =\nsandbox = false"


def make_stand_in(nixpkgs_lib: Path, tmp_path: Path, python: str) -> Path:
    if not os.access("/nix/store", os.W_OK) and not Path("/nix/var/nix/daemon-socket/socket").exists():
        pytest.skip("the Nix store is not writable and no Nix daemon runs: `nix flake check` cannot build")
    if not (ROOT / ".git").exists():
        pytest.skip("the flake is read from git: not a git checkout")
    flake = tmp_path / "nixpkgs"
    flake.mkdir(exist_ok=True)
    stub = Path(__file__).with_name("stub-nixpkgs.nix")
    (flake / "flake.nix").write_text(
        f'{{ outputs = _: import {stub} {{ lib = import {nixpkgs_lib}; python = "{python}"; }}; }}\n'
    )
    return flake


def checkout_python(tmp_path: Path) -> str:
    """This test run's Python importing this checkout first: Nix builders get a clean
    environment, and the interpreter may belong to a venv installed from another checkout."""
    script = tmp_path / "checkout-python"
    script.write_text(f'#!/bin/sh\nPYTHONPATH={json.dumps(str(ROOT))} exec {json.dumps(sys.executable)} "$@"\n')
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def stand_in(nixpkgs_lib, tmp_path) -> Path:
    return make_stand_in(nixpkgs_lib, tmp_path, checkout_python(tmp_path))


def flake_check(nixh, stand_in: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NIX_CONFIG": BUILD_NIX_CONFIG}
    cmd = ["nix", "flake", "check", "--impure", "--no-write-lock-file", "--override-input", "nixpkgs", f"path:{stand_in}", str(ROOT)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_nix_flake_check_passes(nixh, stand_in):
    proc = flake_check(nixh, stand_in)
    assert proc.returncode == 0, proc.stderr


def test_nix_flake_check_fails_when_the_validator_rejects_an_example(nixh, nixpkgs_lib, tmp_path):
    rejecting = tmp_path / "python"
    rejecting.write_text("#!/bin/sh\necho 'invalid, as this stand-in says of every file' >&2\nexit 1\n")
    rejecting.chmod(0o755)
    proc = flake_check(nixh, make_stand_in(nixpkgs_lib, tmp_path, str(rejecting)))
    assert proc.returncode != 0
    assert "mtpstack-examples" in proc.stderr


def test_flake_exposes_modules_as_functions(nixh, nixpkgs_lib):
    env = {**os.environ, "NIX_CONFIG": "experimental-features = nix-command flakes\nsubstituters ="}
    for output in ("nixosModules.default", "darwinModules.default"):
        proc = subprocess.run(
            ["nix", "eval", "--no-write-lock-file", "--override-input", "nixpkgs", f"path:{nixpkgs_lib.parent}",
             f"{ROOT}#{output}", "--apply", "builtins.isFunction"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert (proc.returncode, proc.stdout.strip()) == (0, "true"), proc.stderr


def build_checked_config(nixpkgs_lib: Path, example: Path, python: str) -> subprocess.CompletedProcess:
    """nix-build the module's `checkConfig` step (modules/config-file.nix) for an example."""
    stub = Path(__file__).with_name("stub-nixpkgs.nix")
    expr = (
        f"let np = import {stub} {{ lib = import {nixpkgs_lib}; python = {json.dumps(python)}; }};"
        " pkgs = np.legacyPackages.${builtins.currentSystem}; in"
        f" import {ROOT / 'modules' / 'config-file.nix'} {{ inherit pkgs;"
        " cfg = { checkConfig = true; package = pkgs.callPackage null { }; };"
        f" contents = (import {ROOT / 'modules' / 'lib'}).render (import {example}).services.mtpstack; }}"
    )
    env = {**os.environ, "NIX_CONFIG": BUILD_NIX_CONFIG}
    return subprocess.run(["nix-build", "--no-out-link", "-E", expr], capture_output=True, text=True, env=env, timeout=120)


def test_check_config_builds_a_valid_fleet_and_fails_a_bad_one_with_the_way_out(nixh, nixpkgs_lib, stand_in, tmp_path):
    python = checkout_python(tmp_path)
    good = build_checked_config(nixpkgs_lib, ROOT / "examples" / "nix" / "valid" / "single-mtp.nix", python)
    assert good.returncode == 0, good.stderr
    assert json.loads(Path(good.stdout.strip()).read_text())["workers"]["qwen-mtp"]["maxNumSeqs"] == 2
    bad = build_checked_config(nixpkgs_lib, ROOT / "examples" / "nix" / "invalid" / "backend-forbidden.nix", python)
    assert bad.returncode != 0
    assert "error[backend-forbidden]: workers.qwen.backend" in bad.stderr
    assert "hint: fix the options named above, or set `services.mtpstack.checkConfig = false` to skip this check" in bad.stderr


#: A stand-in for colmena's and deploy-rs' flakes (and nix-darwin's): each tool's app runs its own
#: package, and colmena's `makeHive` stamps the schema its CLI accepts (colmena main: `v0.5`).
TOOL_FLAKE = """{
  inputs.nixpkgs.url = "path:/nonexistent";  # the example makes it follow its own
  outputs = { self, nixpkgs }:
    let per = nixpkgs.lib.genAttrs [ "x86_64-linux" "aarch64-linux" "aarch64-darwin" ];
    in {
      packages = per (system: { NAME = nixpkgs.legacyPackages.${system}.writeText "NAME" "NAME"; });
      apps = per (system: { APP = { type = "app"; program = "${self.packages.${system}.NAME}/bin/NAME"; }; });
      lib = { makeHive = hive: { __schema = "v0.5"; nodes = builtins.attrNames hive; }; darwinSystem = args: args; }
        // per (system: { activate.darwin = config: config; deployChecks = deploy: { }; });
    };
}
"""


def test_the_example_fleet_flake_ships_colmena_and_deploy_rs_from_its_own_inputs(nixh, nixpkgs_lib, tmp_path):
    """`nix eval` of examples/fleet's outputs, offline: every input replaced (`--override-input`), the
    mtpstack input by this repository's flake (from git: its tracked files, not the virtualenvs and caches
    `scripts/test` leaves in the checkout, which a `path:` input would copy and hash on every eval), whose
    nixpkgs follows the example's."""
    stand_in = make_stand_in(nixpkgs_lib, tmp_path, sys.executable)
    overrides = ["--override-input", "nixpkgs", f"path:{stand_in}", "--override-input", "mtpstack", f"git+file://{ROOT}"]
    for name, package, app in (("colmena", "colmena", "colmena"), ("deploy-rs", "deploy-rs", "deploy-rs"), ("nix-darwin", "darwin", "darwin")):
        flake = tmp_path / name
        flake.mkdir()
        (flake / "flake.nix").write_text(TOOL_FLAKE.replace("NAME", package).replace("APP", app))
        overrides += ["--override-input", name, f"path:{flake}"]

    def evaluate(attribute: str) -> object:
        proc = subprocess.run(
            ["nix", "eval", "--impure", "--json", "--no-write-lock-file", *overrides, f"path:{ROOT / 'examples' / 'fleet'}#{attribute}"],
            capture_output=True, text=True, env={**os.environ, "NIX_CONFIG": BUILD_NIX_CONFIG}, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    apps = evaluate("apps")
    assert sorted(apps) == ["aarch64-darwin", "aarch64-linux", "x86_64-linux"]
    for system, tools in apps.items():
        # The app runs the colmena of the input whose makeHive made `colmenaHive`: its schema is the CLI's.
        assert tools["colmena"]["program"].endswith("-colmena/bin/colmena")
        assert tools["deploy-rs"]["program"].endswith("-deploy-rs/bin/deploy-rs")
    assert evaluate("colmenaHive") == {"__schema": "v0.5", "nodes": ["gateway", "meta"]}
    assert evaluate("devShells.x86_64-linux.default.name") == "shell"
