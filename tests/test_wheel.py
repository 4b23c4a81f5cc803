"""The wheel as an installer builds it: one top-level package, its data inside, no bare component names."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BARE = ["proxy", "worker", "validator", "bench", "devkit", "tests"]


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> tuple[Path, list[str]]:
    tmp = tmp_path_factory.mktemp("wheel")
    # pip builds with its own isolated setuptools, as any installer would.
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("mtpstack-*.whl")
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(site)
    return site, names


def run_isolated(code: str, site: Path, cwd: Path, *, site_packages: bool = True) -> subprocess.CompletedProcess:
    # The unpacked wheel first on the path; -S also leaves this venv's site-packages (and its editable install) out.
    flags = [] if site_packages else ["-S"]
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, cwd=cwd,
                          env={"PYTHONPATH": str(site)}, timeout=60)


def test_the_wheel_has_one_top_level_package(unpacked):
    _, names = unpacked
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"mtpstack"}
    # Development support and benchmark scripts stay in the checkout.
    assert not [n for n in names if "/scripts/" in n or "fake_upstream" in n or "/demo/train" in n]
    # The shipped demo pair and the default workloads are package data.
    for want in ("mtpstack/worker/demo/models/target/model.safetensors", "mtpstack/worker/demo/models/mtp/config.json",
                 "mtpstack/bench/prompts/code.jsonl", "mtpstack/proxy/static/dashboard.html"):
        assert want in names


def test_bare_component_names_are_not_importable_from_the_wheel(unpacked, tmp_path):
    site, _ = unpacked
    code = "import importlib.util as u; print(' '.join(n for n in %r if u.find_spec(n) is not None))" % (BARE,)
    out = run_isolated(code, site, tmp_path, site_packages=False)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().split() == []


def test_the_dashboard_is_served_from_the_wheel(unpacked, tmp_path):
    site, _ = unpacked
    # Import the proxy from the unpacked wheel alone (not this tree) and read the page as it serves it.
    code = (
        "import mtpstack.proxy.dashboard as d, sys; "
        f"assert d.__file__.startswith({str(site)!r}), d.__file__; "
        "sys.stdout.buffer.write(d.page())"
    )
    out = run_isolated(code, site, tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == (ROOT / "proxy" / "static" / "dashboard.html").read_bytes()


def test_the_installed_package_exposes_only_mtpstack(tmp_path):
    # This environment's own install (editable, from scripts/bootstrap), run from outside the checkout.
    code = (
        "import importlib.util as u, mtpstack.proxy, mtpstack.worker.demo as d; "
        "print(' '.join(n for n in %r if u.find_spec(n) is not None)); print(mtpstack.proxy.__file__); print(d.DEMO_TARGET)"
    ) % (BARE,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    bare, proxy_file, demo = out.stdout.splitlines()
    assert bare == ""
    assert Path(proxy_file) == ROOT / "proxy" / "__init__.py"
    assert (Path(demo) / "config.json").is_file()
