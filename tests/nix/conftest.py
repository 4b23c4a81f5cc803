"""Helpers for the Nix tests: real Nix (`nix-instantiate`), offline.

Tests that need Nix skip when `nix-instantiate` is missing; module tests also
need nixpkgs' `lib`: NIXPKGS_LIB (a nixpkgs or nixpkgs.lib checkout), by default the pinned copy
beside the checkout (`../shared/nixpkgs-lib`, which CI provides). In CI both are failures, not skips.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.skips import require

ROOT = Path(__file__).resolve().parents[2]
NIX_LIB = ROOT / "modules" / "lib"
EXAMPLES = ROOT / "examples" / "nix"
EVAL_MODULE = Path(__file__).with_name("eval-module.nix")
#: nixpkgs' `lib` when NIXPKGS_LIB is unset: the pinned copy beside the checkout (its `PIN` says which).
DEFAULT_NIXPKGS_LIB = ROOT.parent / "shared" / "nixpkgs-lib"


def nix_env() -> dict[str, str]:
    config = "experimental-features = nix-command flakes\nsubstituters ="
    try:
        grp.getgrnam("nixbld")
    except KeyError:
        config += "\nbuild-users-group ="
    return {**os.environ, "NIX_CONFIG": config}


class NixError(Exception):
    def __init__(self, stderr: str):
        self.stderr = stderr
        super().__init__(stderr)


def run_nix(args: list[str]) -> str:
    """Run a Nix command; its stdout, or NixError with its stderr. The exit code is
    checked before the output is used (a failing --json eval can leave partial JSON)."""
    proc = subprocess.run(args, capture_output=True, text=True, env=nix_env(), timeout=120, cwd=ROOT)
    if proc.returncode != 0:
        raise NixError(proc.stderr)
    return proc.stdout


def nix_eval(expr: str | None = None, file: Path | None = None, args: list[str] = ()) -> object:
    """`nix-instantiate --eval --strict --json` of an expression or a file, parsed."""
    cmd = ["nix-instantiate", "--eval", "--strict", "--json", *args]
    cmd += ["-E", expr] if expr is not None else [str(file)]
    return json.loads(run_nix(cmd))


def nix_string(value: str) -> str:
    """A Python string as a Nix string literal (JSON escapes are valid Nix escapes
    except for `$`, which would start an interpolation)."""
    return json.dumps(value).replace("${", "\\${")


@pytest.fixture(scope="session")
def nix() -> None:
    if shutil.which("nix-instantiate") is None:
        require("`nix-instantiate` is not on PATH (Debian: apt-get install nix-bin; `.ci/run` installs it)")


@pytest.fixture(scope="session")
def nixpkgs_lib(nix) -> Path:
    value = os.environ.get("NIXPKGS_LIB")
    path = Path(value) if value else DEFAULT_NIXPKGS_LIB.resolve()
    if not (path / "lib" / "default.nix").is_file():
        where = f"NIXPKGS_LIB ({path})" if value else f"NIXPKGS_LIB is unset and the default {path}"
        require(f"{where} does not hold nixpkgs' `lib/default.nix`: point NIXPKGS_LIB at a nixpkgs or nixpkgs.lib checkout")
    return path / "lib"


def eval_module(nixpkgs_lib: Path, platform: str, settings: str) -> dict:
    """Evaluate the NixOS or nix-darwin module with `settings` (a Nix expression of a module)."""
    return nix_eval(
        file=EVAL_MODULE,
        args=["--arg", "lib", f"import {nixpkgs_lib}", "--argstr", "platform", platform, "--arg", "settings", settings],
    )


def example_files(kind: str) -> list[Path]:
    return sorted((EXAMPLES / kind).glob("*.nix"))


def expected_code(example: Path) -> str:
    """The finding code an invalid example announces in its `# expect: CODE` line."""
    for line in example.read_text().splitlines():
        if line.startswith("# expect:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{example} has no `# expect: CODE` line")


@pytest.fixture(scope="session")
def nixh(nix):
    """The helpers above, for test modules (conftest is not importable under importlib mode)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        eval=nix_eval,
        run=run_nix,
        env=nix_env,
        string=nix_string,
        NixError=NixError,
        eval_module=eval_module,
        root=ROOT,
        lib=NIX_LIB,
        example_files=example_files,
        expected_code=expected_code,
    )
