"""Import a benchmark script (`bench/scripts/NAME.py`) as a module, for the tests of its pure parts.

The scripts are run by path and are not a package; this loads one under the name
`bench_scripts.NAME` (once: later calls return the same module)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "bench" / "scripts"


def load_script(name: str) -> ModuleType:
    key = f"bench_scripts.{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = SCRIPTS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark script {path}")
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))  # for the scripts' own `import _checkout`
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module
