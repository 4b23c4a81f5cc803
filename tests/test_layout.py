"""The layout the packaging promises: one import root (`mtpstack`) over the component folders."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

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


# -- layers -------------------------------------------------------------------------------
# validator <- proxy / worker / bench <- CLI, with BASE (the modules directly in `mtpstack/`
# that are not the CLI: version, errors, runtime, logs, request ids) below them all, and WEB (what
# the two services' aiohttp apps share) beside the validator, above the base.

#: The CLI layer: it may import anything, and nothing below it imports it.
CLI = {"mtpstack.cli", "mtpstack.commands", "mtpstack.status", "mtpstack.up", "mtpstack.banner", "mtpstack.__main__"}
#: The services' shared aiohttp parts (the JSON-error middleware, the error response): not the base,
#: which is stdlib only, since they import aiohttp.
WEB = {"mtpstack.web"}
#: What each layer may import (besides itself and third-party code).
MAY_IMPORT = {
    "base": {"base"},
    "validator": {"base", "validator"},
    "web": {"base"},
    "proxy": {"base", "validator", "web"},
    "worker": {"base", "validator", "web"},
    "bench": {"base", "validator"},
    "cli": {"base", "validator", "web", "proxy", "worker", "bench", "cli"},
}
#: The worker's parts the bench needs to start and prove workers: process handling, the weights
#: proof and the demo pair's paths, none of which loads mlx.
BENCH_USES_WORKER = {"mtpstack.worker.launcher", "mtpstack.worker.proof", "mtpstack.worker.demo"}
#: The proxy's Prometheus parser: the bench reads the worker's and the proxy's `/metrics` with the
#: parser the proxy's fleet view uses, not a second one.
BENCH_USES_PROXY = {"mtpstack.proxy.prometheus"}


def product_modules() -> dict[str, Path]:
    """Every module of the wheel by its import name (from pyproject's `package-dir`)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = {}
    for package, folder in tool["package-dir"].items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            inside = [ROOT / folder / Path(*rel.parts[:i]) for i in range(len(rel.parts))]
            if SKIP.intersection(rel.parts) or not all((d / "__init__.py").exists() for d in inside):
                continue  # not in a package (bench/scripts), or a nested package listed on its own
            parts = [*rel.parent.parts, path.stem] if path.stem != "__init__" else list(rel.parent.parts)
            modules[".".join([package, *parts])] = path
    return modules


MODULES = product_modules()


def layer(module: str) -> str:
    if module in CLI:
        return "cli"
    if module in WEB:
        return "web"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in BARE else "base"


def imports(module: str, tree: ast.Module, at_import_time: bool = False) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names taken from it) for each import of a product module; with
    `at_import_time`, only those run when the module is imported (not those inside functions)."""
    nodes = list(ast.iter_child_nodes(tree)) if at_import_time else list(ast.walk(tree))
    found = []
    while nodes:
        node = nodes.pop()
        if at_import_time and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            nodes.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, `level - 1` packages up
                package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((node.lineno, sub, []) if sub in MODULES else (node.lineno, base, [a.name]))
    return [(line, name, names) for line, name, names in found if name in MODULES]


def trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def test_the_layers_point_one_way():
    bad = []
    for module, tree in trees().items():
        own = layer(module)
        for line, imported, _ in imports(module, tree):
            other = layer(imported)
            if other == own or other in MAY_IMPORT[own]:
                continue
            if own == "bench" and imported in BENCH_USES_WORKER | BENCH_USES_PROXY:
                continue
            bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {own} imports {other} (`{imported}`)")
    assert bad == []



def test_the_product_never_imports_the_bench():
    """The bench may import the product; nothing of the product imports the bench, its scripts
    (`bench/scripts/`, not a package) included, nor `devkit` or `tests`. The CLI runs `mtpstack bench`
    by the module's name (`mtpstack.cli.SUBCOMMANDS`), importing it only when asked to."""
    bench = {m for m in MODULES if layer(m) == "bench"}
    bad = []
    for module, tree in trees().items():
        if layer(module) == "bench":
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            bad += [f"{MODULES[module].relative_to(ROOT)}:{node.lineno}: `{name}`" for name in names
                    if name in bench or name.startswith("mtpstack.bench") or name.split(".")[0] in ("bench", "devkit", "tests")]
    assert bad == []


#: A runner may import the report written apart from it (issue 50: runners and reports apart).
RUNNER_REPORTS = {("load_bench", "load_report")}


def test_no_benchmark_script_imports_another():
    """What two benchmarks share lives in the package (`mtpstack.bench.parts`, `.servers`, `.stacks`,
    `.workloads`), so that changing one benchmark cannot break another; imports inside functions count."""
    scripts = {p.stem: p for p in (ROOT / "bench" / "scripts").glob("*.py")}
    bad = [f"{path.relative_to(ROOT)}:{line}: imports the script `{name}`"
           for stem, path in sorted(scripts.items()) for line, name in imported_names(path)
           if name in scripts and name != "_checkout" and (stem, name) not in RUNNER_REPORTS]
    assert bad == []


@pytest.mark.parametrize("at_import_time", [True, False], ids=["module level", "inside functions too"])
def test_no_import_cycles(at_import_time):
    """A cycle through an import inside a function is still two modules that need each other."""
    graph = {m: {i for _, i, _ in imports(m, tree, at_import_time=at_import_time) if i != m} for m, tree in trees().items()}
    cycles = []
    for start in sorted(graph):
        # A path back to `start` through modules sorted after it: each cycle found once, from its first module.
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    cycles.append(" -> ".join([*path, start]))
                elif nxt > start and nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert cycles == []


def test_other_packages_use_the_validators_public_names_only():
    import mtpstack.validator

    bad = []
    for module, tree in trees().items():
        if layer(module) == "validator":
            continue
        for line, imported, names in imports(module, tree):
            if layer(imported) != "validator":
                continue
            hidden = [n for n in names if n not in mtpstack.validator.__all__]
            if imported != "mtpstack.validator" or hidden:
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: `{imported}` {hidden or ''}".rstrip())
    assert bad == []


def test_no_module_imports_a_private_name_of_another():
    bad = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {a.name} from {node.module}"
                        for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []


def test_the_base_layer_imports_the_standard_library_only():
    bad = []
    for module, tree in trees().items():
        if layer(module) != "base":
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top != "mtpstack" and top not in sys.stdlib_module_names:
                    bad.append(f"{MODULES[module].relative_to(ROOT)}:{node.lineno}: `{name}`")
    assert bad == []



# -- sizes -----------------------------------------------------------------------------------

#: The product's folders (the wheel but the bench): each module and each function kept small enough
#: to read whole (issue 50).
PRODUCT_FOLDERS = ("mtpstack", "worker", "proxy", "validator")
MODULE_LINES = 500
FUNCTION_LINES = 80
#: Modules allowed over `MODULE_LINES`, by path, each with its reason: none.
LONG_MODULES: dict[str, str] = {}
#: Functions allowed over `FUNCTION_LINES`, by `path:name`, each with its reason: none.
LONG_FUNCTIONS: dict[str, str] = {}


def product_files() -> list[Path]:
    return sorted(p for folder in PRODUCT_FOLDERS for p in (ROOT / folder).rglob("*.py") if not SKIP.intersection(p.parts))


def test_no_product_module_is_over_its_size():
    long = {str(p.relative_to(ROOT)): n for p in product_files() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert {k: v for k, v in long.items() if k not in LONG_MODULES} == {}, f"split these (at most {MODULE_LINES} lines each)"
    assert set(LONG_MODULES) <= set(long), "an allowed long module is short now: take it off LONG_MODULES"


def test_no_product_function_is_over_its_size():
    long = {}
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := node.end_lineno - node.lineno + 1) > FUNCTION_LINES:
                long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert {k: v for k, v in long.items() if k not in LONG_FUNCTIONS} == {}, f"split these (at most {FUNCTION_LINES} lines each)"
    assert set(LONG_FUNCTIONS) <= set(long), "an allowed long function is short now: take it off LONG_FUNCTIONS"

# -- the family table --------------------------------------------------------------------


def test_every_served_mtp_family_is_one_module_with_a_head_class():
    """docs/architecture.md's recipe: a family is one table entry and `worker/mtp/<module>.py` defining `Head`."""
    from mtpstack.validator import CACHE_KINDS, FAMILIES

    recipe = (ROOT / "docs" / "architecture.md").read_text()
    assert "validator/families.py" in recipe and "`Head`" in recipe
    for family in FAMILIES:
        assert set(kind for kinds in family.targets.values() for kind in kinds) <= set(CACHE_KINDS), family.head_type
        module = ROOT / "worker" / "mtp" / f"{family.module}.py"
        if not family.served:
            assert family.why_not, f"{family.head_type} is not served and says not why"
            continue
        assert module.exists(), f"{family.head_type}: no {module.relative_to(ROOT)}"
        heads = [n for n in ast.walk(ast.parse(module.read_text())) if isinstance(n, (ast.ClassDef, ast.Assign))
                 and ("Head" == getattr(n, "name", None) or any(getattr(t, "id", None) == "Head" for t in getattr(n, "targets", [])))]
        assert heads, f"{module.relative_to(ROOT)} defines no `Head`"


def test_no_module_but_the_table_names_a_head_type():
    """One owner: the head types are spelled in the family table (and the docs), not in code that reads it."""
    from mtpstack.validator import FAMILIES

    owners = {ROOT / "validator" / "families.py"}
    bad = []
    for path in MODULES.values():
        if path in owners:
            continue
        text = path.read_text()
        bad += [f"{path.relative_to(ROOT)}: {f.head_type}" for f in FAMILIES if f'"{f.head_type}"' in text]
    assert bad == []


def family_words() -> dict[Path, set[str]]:
    """Per family, its module's path and what only it and the table spell in code: the head type,
    the target types (mlx-lm's module names for them too), and the head class its module names `Head`."""
    from mtpstack.validator import FAMILIES

    words = {}
    for family in FAMILIES:
        module = ROOT / "worker" / "mtp" / f"{family.module}.py"
        own = {family.head_type, *family.targets}
        if module.exists():
            own |= {node.value.id for node in ast.walk(ast.parse(module.read_text()))
                    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                    and any(getattr(t, "id", None) == "Head" for t in node.targets)}
        words[module] = own
    return words


def spelled_in_code(tree: ast.Module) -> list[tuple[int, str]]:
    """Every identifier, imported name and string constant of a module, docstrings left out (prose)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            parts = (node.module or "").split(".") if isinstance(node, ast.ImportFrom) else []
            found += [(node.lineno, p) for p in parts]
            found += [(node.lineno, p) for a in node.names for p in a.name.split(".")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.append((node.lineno, node.value))
    return found


def test_no_module_but_a_familys_own_and_the_table_spells_its_types_or_head_class():
    """A new family is one module and one table row: no other module names its head type, its target
    types (nor imports mlx-lm's modules of them), or its head class, in quotes or outside them."""
    words = family_words()
    table = ROOT / "validator" / "families.py"
    bad = []
    for path in MODULES.values():
        if path == table:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for line, word in spelled_in_code(tree):
            bad += [f"{path.relative_to(ROOT)}:{line}: `{word}` ({owner.name}'s)" for owner, own in words.items()
                    if owner != path and word in own]
    assert bad == []


def test_every_served_family_module_exports_its_targets_hooks():
    """Beside `Head`, each served family's module says what its targets need (`TARGET`), which the
    engine reads through the table instead of keeping its own registries."""
    from mtpstack.validator import FAMILIES

    for family in FAMILIES:
        if not family.served:
            continue
        module = ROOT / "worker" / "mtp" / f"{family.module}.py"
        assigned = {t.id for node in ast.walk(ast.parse(module.read_text())) if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
        assert "TARGET" in assigned, f"{module.relative_to(ROOT)} exports no `TARGET`"


# -- the settings table ------------------------------------------------------------------

#: Literals spelled like a worker flag that belong to another program's command line, by module
#: and function: `mlx_lm.server` takes `--model`, `--draft-model`, `--host` and `--port` too, and
#: `mtpstack up --host` names a host, and the bench starts mlx-vlm's server (`mlx_vlm.server`) beside
#: the worker with that server's own flags.
OTHER_PROGRAMS_FLAGS = {
    ("mtpstack.validator.argv", "_mlx_lm_argv"): {"--model", "--draft-model", "--host", "--port"},
    ("mtpstack.bench.servers", "server_argv"): {"--model", "--max-num-seqs", "--host", "--port", "--draft-model",
                                                "--draft-kind", "--draft-block-size"},
    ("mtpstack.commands", "register"): {"--host"},
}


def test_no_module_but_the_settings_table_spells_a_worker_flag():
    """One owner: a worker flag is declared in `validator/settings.py`; the parser, the argv and the
    checks take it from there (`SETTINGS[name].flag`), never a literal of their own."""
    from mtpstack.validator import WORKER_SETTINGS

    flags = {s.flag for s in WORKER_SETTINGS}
    bad = []
    for module, tree in trees().items():
        if module == "mtpstack.validator.settings":
            continue
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            spelled = node.value.split("=", 1)[0]
            if spelled not in flags:
                continue
            inside = {f.name for f in functions if f.lineno <= node.lineno <= f.end_lineno}
            if any(spelled in OTHER_PROGRAMS_FLAGS.get((module, name), ()) for name in inside):
                continue
            bad.append(f"{MODULES[module].relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert bad == []


# -- the endpoint table ------------------------------------------------------------------


def test_no_service_module_spells_an_endpoint_path_the_table_declares():
    """One owner: the paths both services serve are `mtpstack/endpoints.py`'s rows; the worker's
    routes, the proxy's forwarding and routing, and the handlers read them from there."""
    from mtpstack.endpoints import ENDPOINTS

    paths = {e.path for e in ENDPOINTS}
    suffixes = {p.removeprefix("/v1") for p in paths}  # `path.endswith("/responses")` is the same fact
    bad = []
    for module, tree in trees().items():
        if layer(module) not in ("worker", "proxy"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in paths | suffixes:
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert bad == []


# -- the engine's rooms --------------------------------------------------------------------

#: The engine's rooms, one job each (docs/architecture.md): kept small enough to read whole.
ENGINE_ROOMS = ("loading", "sequence", "batch", "scheduler", "snapshots")
ROOM_LINES = 350


def test_each_engine_room_stays_under_its_size():
    long = {room: n for room in ENGINE_ROOMS if (n := len((ROOT / "worker" / f"{room}.py").read_text().splitlines())) > ROOM_LINES}
    assert long == {}, f"split these (at most {ROOM_LINES} lines each)"


def test_the_engine_rooms_reach_no_private_attribute_of_another_object():
    """The batches move a sequence along through its methods, the scheduler never touches a cache's
    insides: in the engine's rooms a private name is read on `self` (or `cls`) only."""
    bad = []
    for room in ENGINE_ROOMS:
        path = ROOT / "worker" / f"{room}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: `.{node.attr}`")
    assert bad == []
