"""The files modules/pins.nix pins by hash, fetched from PyPI and checked against what the pins and
the package say of them, so an upstream change that breaks the Nix package fails CI rather than an
operator's `darwin-rebuild`:

- each file's hash is the pinned one (`nix hash file` of the download);
- each wheel is built for the platform pinned (its `WHEEL` file's tag);
- an mlx-metal wheel carries MLX's JACCL backend exactly when `jaccl` says so (its libmlx links
  `libjaccl.dylib` and holds JACCL's group; without it, the `no_jaccl.cpp` stub's message);
- the mlx frontend wheels require the pinned mlx-metal (`Requires-Dist`);
- every path the package's mlx-lm check phase skips is in the sdist (nixpkgs' pytestCheckHook
  aborts on a path without `::` that matches no file).

`python -m devkit.nix_pins fetch [DIR]` downloads what DIR (default `.cache/nix-pins`) lacks with
`pip download`; `scripts/test` runs it, and tests/nix/test_pinned_files.py checks the files.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from devkit.nix_package import ROOT, pins

DEFAULT_DIR = ROOT / ".cache" / "nix-pins"
#: In libmlx when JACCL is compiled in (the adapter class, mlx/distributed/jaccl/jaccl.cpp) ...
JACCL_BUILT_IN = b"JACCLGroup"
#: ... and the stub's refusal otherwise (mlx/distributed/jaccl/no_jaccl.cpp).
JACCL_STUB = b"Cannot initialize jaccl distributed backend."


@dataclass(frozen=True)
class PinnedFile:
    """One file pins.nix pins: its name on PyPI, its SRI hash, and how pip fetches it."""

    filename: str
    hash: str
    pip_args: tuple[str, ...]
    platform: str | None = None  # wheels: the platform tag pinned
    jaccl: bool | None = None  # mlx-metal wheels: whether JACCL must be in libmlx
    variant: str | None = None  # mlx and mlx-metal wheels: the macOS variant


def pinned_files(p: dict) -> list[PinnedFile]:
    """Every file `p` (pins.nix evaluated) pins."""
    lm = p["mlx-lm"]
    files = [PinnedFile(f"mlx_lm-{lm['version']}.tar.gz", lm["hash"],
                        ("--no-binary", ":all:", f"mlx-lm=={lm['version']}"))]  # fmt: skip
    for variant, wheel in sorted(p["mlx"]["wheels"].items()):
        for python, sri in sorted(wheel["hashes"].items()):
            cp = "cp" + python.replace(".", "")
            files.append(PinnedFile(
                f"mlx-{p['mlx']['version']}-{cp}-{cp}-{wheel['platform']}.whl", sri,
                ("--only-binary", ":all:", "--platform", wheel["platform"], "--python-version", python, f"mlx=={p['mlx']['version']}"),
                platform=wheel["platform"], variant=variant,
            ))  # fmt: skip
    for variant, wheel in sorted(p["mlx-metal"]["wheels"].items()):
        files.append(PinnedFile(
            f"mlx_metal-{p['mlx-metal']['version']}-py3-none-{wheel['platform']}.whl", wheel["hash"],
            ("--only-binary", ":all:", "--platform", wheel["platform"], f"mlx-metal=={p['mlx-metal']['version']}"),
            platform=wheel["platform"], jaccl=wheel["jaccl"], variant=variant,
        ))  # fmt: skip
    return files


def sri_sha256(path: Path) -> str:
    """`nix hash file PATH`: the file's SHA-256 as an SRI string."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha256-" + base64.b64encode(digest.digest()).decode()


def wheel_metadata(path: Path, name: str) -> str:
    """The text of `*.dist-info/NAME` in a wheel."""
    with zipfile.ZipFile(path) as z:
        (member,) = [m for m in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/" + re.escape(name), m)]
        return z.read(member).decode()


def libmlx_has_jaccl(path: Path) -> bool:
    """Whether an mlx-metal wheel's libmlx carries JACCL; ValueError when it holds neither JACCL
    nor the stub (a layout this check no longer understands)."""
    with zipfile.ZipFile(path) as z:
        lib = z.read("mlx/lib/libmlx.dylib")
    if JACCL_BUILT_IN in lib and JACCL_STUB not in lib:
        return True
    if JACCL_STUB in lib and JACCL_BUILT_IN not in lib:
        return False
    raise ValueError(f"{path.name}: libmlx holds {'both' if JACCL_STUB in lib else 'neither'} of JACCL's group and its stub")


def sdist_files(path: Path) -> list[str]:
    """The files of an sdist, relative to its top folder (where the check phase runs)."""
    with tarfile.open(path) as t:
        return [m.name.split("/", 1)[1] for m in t.getmembers() if m.isfile() and "/" in m.name]


def unmatched_test_paths(paths: list[str], files: list[str]) -> list[str]:
    """The entries of a `disabledTestPaths` that name no file: a glob without `::` matching nothing
    (which aborts pytestCheckHook), or a `file::test` whose file is missing (a deselection that
    silently skips nothing)."""
    return [p for p in paths if not fnmatch.filter(files, p.split("::", 1)[0])]


def fetch(dest: Path, files: list[PinnedFile]) -> list[PinnedFile]:
    """Download the files `dest` lacks; returns the ones fetched."""
    dest.mkdir(parents=True, exist_ok=True)
    missing = [f for f in files if not (dest / f.filename).is_file()]
    for f in missing:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--dest", str(dest), *f.pip_args], check=True)  # fmt: skip
        if not (dest / f.filename).is_file():
            raise FileNotFoundError(f"pip did not download `{f.filename}` into {dest}")
    return missing


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "fetch":
        print("usage: python -m devkit.nix_pins fetch [DIR]", file=sys.stderr)
        return 2
    dest = Path(argv[1]) if len(argv) > 1 else DEFAULT_DIR
    fetched = fetch(dest, pinned_files(pins()))
    if fetched:
        print(f"nix-pins: fetched {len(fetched)} pinned file(s) into {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
