"""modules/package.nix evaluated with nixpkgs' `lib` (NIXPKGS_LIB) and a stand-in Python package
set: which mlx the package takes per platform, and that a default config evaluates on
aarch64-darwin whether or not nixpkgs carries the Metal build."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nix, pytest.mark.nixpkgs_lib]
CPU_ONLY = "workers on aarch64-darwin run mlx on the CPU only"


def package_mlx(nixh, nixpkgs_lib: Path, system: str, with_bin: bool) -> subprocess.CompletedProcess:
    """The `pname` of the mlx the package carries, on `system`, with or without `mlx-bin` in nixpkgs."""
    expr = f"""
      let
        lib = import {nixpkgs_lib};
        names = [ "aiohttp" "huggingface-hub" "matplotlib" "mlx-lm" "numpy" "prometheus-client" "pydantic" "pyyaml" "rich" "tokenizers" "setuptools" ];
        base = lib.genAttrs names (n: "/nix/store/00000000000000000000000000000000-${{n}}")
          // {{ mlx = {{ pname = "mlx"; }}; }}
          // lib.optionalAttrs {str(with_bin).lower()} {{ mlx-bin = {{ pname = "mlx-bin"; }}; }};
        python3 = {{
          override = {{ self, packageOverrides }}:
            let final = base // packageOverrides final base; in
            {{ pkgs = final // {{ buildPythonApplication = args: args; }}; }};
        }};
        stdenv.hostPlatform = {{
          isDarwin = lib.hasSuffix "-darwin" "{system}";
          isAarch64 = lib.hasPrefix "aarch64-" "{system}";
        }};
      in (import {ROOT / "modules" / "package.nix"} {{ inherit lib stdenv python3; }}).passthru.mlx.pname
    """
    return subprocess.run(["nix-instantiate", "--eval", "--json", "-E", expr], capture_output=True, text=True, env=nixh.env(), timeout=60)


@pytest.mark.parametrize(
    ("system", "with_bin", "mlx", "warned"),
    [
        ("aarch64-darwin", True, "mlx-bin", False),  # the Metal wheel
        ("aarch64-darwin", False, "mlx", True),  # evaluates, CPU only, and says so
        ("x86_64-linux", True, "mlx", False),  # Linux: the source build, never the Mac wheel
    ],
)
def test_the_package_takes_the_metal_mlx_on_apple_silicon_and_warns_when_there_is_none(nixh, nixpkgs_lib, system, with_bin, mlx, warned):
    proc = package_mlx(nixh, nixpkgs_lib, system, with_bin)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == mlx
    assert (CPU_ONLY in proc.stderr) == warned
