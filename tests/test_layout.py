"""The layout the packaging promises: one import root (`mtpstack`) over the component folders."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BARE = {"proxy", "worker", "validator", "bench"}
SKIP = {".venv", "build", ".git", "__pycache__", ".hypothesis", ".mtpstack"}


def python_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if not SKIP.intersection(rel.parts) and not rel.parts[0].startswith("."):
            out.append(path)
    return out


def imported_names(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
    return names


def test_nothing_imports_a_bare_component_name():
    # Under a bare name a module would load twice (once as `proxy.app`, once as `mtpstack.proxy.app`).
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in python_files()
           for line, name in imported_names(p) if name.split(".")[0] in BARE]
    assert bad == []


def test_the_package_list_covers_every_package_folder():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = tool["package-dir"]
    declared = set(tool["packages"])
    found = set()
    for name, folder in package_dir.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if not SKIP.intersection(rel.parts):
                found.add(".".join([name, *rel.parts]))
    assert found == declared
    # The benchmark scripts are run by path and stay out of the package.
    assert not (ROOT / "bench" / "scripts" / "__init__.py").exists()
