"""The dashboard ships inside the wheel: built from this tree, unpacked, and served from there."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_built_wheel_carries_the_dashboard_page(tmp_path):
    # pip builds with its own isolated setuptools, as any installer would.
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("mtpstack-*.whl")
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
    # Import the proxy from the unpacked wheel alone (not this tree) and read the page as it serves it.
    code = (
        "import proxy, proxy.dashboard as d, sys; "
        f"assert proxy.__file__.startswith({str(unpacked)!r}), proxy.__file__; "
        "sys.stdout.buffer.write(d.page())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=tmp_path, env={"PYTHONPATH": str(unpacked)}, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == (ROOT / "proxy" / "static" / "dashboard.html").read_bytes()
