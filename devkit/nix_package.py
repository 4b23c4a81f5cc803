"""The two files modules/package.nix is checked against, written from the source they derive from.

- `modules/python-imports.json`: what the package's `pythonImportsCheck` imports: every `mtpstack`
  module a running worker, proxy and `mtpstack validate` (the module's `checkConfig`) can import,
  lazy imports inside functions included, and every third-party module those import. Derived from
  the source's import statements, starting at the modules `mtpstack.cli.SUBCOMMANDS` runs for
  those commands, so a new lazy import of the engine is checked at build time without anyone
  listing it.
- `requirements-nixpkgs.lock`: requirements.lock with the versions the Nix package takes
  (modules/pins.nix) in place of the lock's, for the second virtualenv
  (scripts/test-nixpkgs-pins) that runs the worker's and proxy's tests with them.

`python -m devkit.nix_package` rewrites both; tests/nix/test_package_drift.py fails when either
differs from what this computes now.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS_FILE = ROOT / "modules" / "python-imports.json"
PINS_FILE = ROOT / "modules" / "pins.nix"
LOCK = ROOT / "requirements.lock"
NIXPKGS_LOCK = ROOT / "requirements-nixpkgs.lock"

#: The commands that run as services (`worker`, `proxy`) or at build time (`validate`, behind
#: `checkConfig`); their modules are the roots of the import closure.
SERVICE_COMMANDS = ("worker", "proxy", "validate")


def package_dirs() -> dict[str, Path]:
    """Import name -> folder, from pyproject's `tool.setuptools.package-dir` (one import root)."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in tool["package-dir"].items()}


def module_file(name: str, dirs: dict[str, Path]) -> Path | None:
    """The source file of `mtpstack` module `name`, or None when it is not one."""
    for prefix in sorted(dirs, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "."):
            base = dirs[prefix].joinpath(*name[len(prefix) :].lstrip(".").split(".")) if name != prefix else dirs[prefix]
            if (base / "__init__.py").is_file():
                return base / "__init__.py"
            if base.with_suffix(".py").is_file():
                return base.with_suffix(".py")
            return None
    return None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, name: str, dirs: dict[str, Path]) -> set[str]:
    """Every module `path` (module `name`) imports anywhere, functions included; not under
    `if TYPE_CHECKING:`. `from a import b` yields `a.b` when that is a module of ours, else `a`."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            found.add(module)
            for alias in node.names:
                if module_file(f"{module}.{alias.name}", dirs) is not None:
                    found.add(f"{module}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def roots() -> list[str]:
    """The service commands' modules, and the MTP family modules the worker imports by the name the
    family table gives (`mtpstack.worker.mtp.families`), which no import statement spells."""
    sys.path.insert(0, str(ROOT))
    try:
        from mtpstack.cli import SUBCOMMANDS
        from mtpstack.validator import FAMILIES
    finally:
        sys.path.remove(str(ROOT))
    families = [f"mtpstack.worker.mtp.{f.module}" for f in FAMILIES if f.served]
    return ["mtpstack.cli", *dict.fromkeys(SUBCOMMANDS[c] for c in SERVICE_COMMANDS), *families]


def python_imports() -> list[str]:
    """The closure over `mtpstack` modules from `roots()`, then the third-party modules they
    import (the standard library left out), each list sorted; parents before children."""
    dirs = package_dirs()
    ours: set[str] = set()
    theirs: set[str] = set()
    todo = roots()
    while todo:
        name = todo.pop()
        if name in ours:
            continue
        path = module_file(name, dirs)
        if path is None:
            raise ValueError(f"`{name}` is imported as an mtpstack module but has no source file")
        ours.add(name)
        # A submodule's import runs its parents' `__init__` first.
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
        for imported in imports_of(path, name, dirs):
            top = imported.split(".")[0]
            if top == "mtpstack":
                todo.append(imported)
            elif top not in sys.stdlib_module_names and top != "__future__":
                theirs.add(imported)
    return sorted(ours) + sorted(theirs)


def pins() -> dict:
    """modules/pins.nix, evaluated by Nix."""
    out = subprocess.run(
        ["nix-instantiate", "--eval", "--strict", "--json", str(PINS_FILE)],
        capture_output=True, text=True, check=True, env={**os.environ, "NIX_CONFIG": "substituters ="},
    )  # fmt: skip
    return json.loads(out.stdout)


def pinned_requirements(p: dict) -> dict[str, list[str]]:
    """Distribution -> the requirement lines the Nix package's versions make of it."""
    darwin, linux = "sys_platform == 'darwin'", "sys_platform == 'linux'"
    return {
        "mlx": [f"mlx=={p['mlx']['version']} ; {darwin}", f"mlx=={p['nixpkgs']['mlx']} ; {linux}"],
        "mlx-cpu": [f"mlx-cpu=={p['nixpkgs']['mlx']} ; {linux}"],
        "mlx-metal": [f"mlx-metal=={p['mlx-metal']['version']} ; {darwin}"],
        "mlx-lm": [f"mlx-lm=={p['mlx-lm']['version']}"],
        "llguidance": [f"llguidance=={p['nixpkgs']['llguidance']}"],
    }


HEADER = """\
# The versions the Nix package (modules/package.nix) runs with, for scripts/test-nixpkgs-pins:
# requirements.lock with mlx, mlx-cpu, mlx-metal, mlx-lm and llguidance at modules/pins.nix's versions
# (on Linux the package takes nixpkgs' source-built mlx, at least `nixpkgs.mlx`).
# Written by `python -m devkit.nix_package`; do not edit (tests/nix/test_package_drift.py compares).
"""


def nixpkgs_lock(lock_text: str, p: dict) -> str:
    """requirements.lock's text with the pinned distributions' lines replaced."""
    replacing = pinned_requirements(p)
    out = [HEADER]
    seen: set[str] = set()
    for line in lock_text.splitlines():
        if line.startswith("#") and not out[1:]:
            continue  # uv's header: this file is not uv's output
        name = line.split("==", 1)[0] if "==" in line and not line.startswith(" ") else None
        if name in replacing:
            if name not in seen:
                out += replacing[name]
                seen.add(name)
            continue
        out.append(line)
    missing = set(replacing) - seen
    if missing:
        raise ValueError(f"requirements.lock has no line for: {', '.join(sorted(missing))}")
    return "\n".join(out) + "\n"


def main() -> int:
    IMPORTS_FILE.write_text(json.dumps(python_imports(), indent=2) + "\n")
    NIXPKGS_LOCK.write_text(nixpkgs_lock(LOCK.read_text(), pins()))
    print(f"wrote {IMPORTS_FILE.relative_to(ROOT)} and {NIXPKGS_LOCK.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
