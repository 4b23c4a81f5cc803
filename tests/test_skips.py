"""The skip ledger (`tests/skips.py`): a real pytest run of a small folder, with and without CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.skips import EXPECTED, skip_reason, unexpected

ROOT = Path(__file__).resolve().parents[1]
CONFTEST = """
from tests.skips import SkipLedger

def pytest_configure(config):
    config.pluginmanager.register(SkipLedger(), "skip-ledger")
"""


def run(tmp_path: Path, tests: str, ci: bool) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_x.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this repository's settings
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


UNEXPECTED = """
import pytest

def test_ok():
    pass

@pytest.mark.skip(reason="a guard nobody decided on")
def test_marked():
    pass

def test_inside():
    pytest.skip("a guard nobody decided on")

@pytest.mark.parametrize("n", [1, 2])
def test_expected(n):
    pytest.skip("JACCL may be available on a Mac")
"""


def test_an_unexpected_skip_fails_a_ci_run_and_is_listed_by_reason(tmp_path):
    proc = run(tmp_path, UNEXPECTED, ci=True)
    assert proc.returncode == 1, proc.stdout
    out = proc.stdout
    assert "skipped tests by reason (4 in 2 reasons)" in out
    assert "[2] NOT EXPECTED: a guard nobody decided on" in out
    assert "[2] expected: JACCL may be available on a Mac" in out
    assert "test_x.py::test_marked" in out and "test_x.py::test_inside" in out and "test_x.py::test_expected[2]" in out
    assert "2 skips have a reason not in tests/skips.py's EXPECTED: they fail this run" in out


def test_outside_ci_the_same_skips_are_listed_and_the_run_passes(tmp_path):
    proc = run(tmp_path, UNEXPECTED, ci=False)
    assert proc.returncode == 0, proc.stdout
    assert "[2] NOT EXPECTED: a guard nobody decided on" in proc.stdout and "would fail it in CI" in proc.stdout


def test_expected_skips_alone_pass_a_ci_run(tmp_path):
    proc = run(tmp_path, "import pytest\n\ndef test_a():\n    pytest.skip('JACCL may be available on a Mac')\n", ci=True)
    assert proc.returncode == 0, proc.stdout
    assert "NOT EXPECTED" not in proc.stdout


def test_a_module_skipped_whole_counts_and_no_tests_left_is_a_failure_not_exit_5(tmp_path):
    proc = run(tmp_path, "import pytest\npytest.skip('not decided', allow_module_level=True)\n\ndef test_a():\n    pass\n", ci=True)
    assert proc.returncode == 1, proc.stdout
    assert "[1] NOT EXPECTED: not decided" in proc.stdout


def test_a_run_without_tests_keeps_pytests_exit_5(tmp_path):
    assert run(tmp_path, "X = 1\n", ci=True).returncode == 5


def test_a_failing_test_keeps_its_failure(tmp_path):
    proc = run(tmp_path, "def test_a():\n    assert False\n", ci=True)
    assert proc.returncode == 1 and "skipped tests by reason" not in proc.stdout


def test_xfail_is_not_a_skip(tmp_path):
    proc = run(tmp_path, "import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_a():\n    assert False\n", ci=True)
    assert proc.returncode == 0 and "skipped tests by reason" not in proc.stdout


@pytest.mark.parametrize("reason", [
    "mlx 0.31.2's gather_qmm takes no `global_scale`, which mlx-lm's quantized MoE layers pass",
    "mlx 0.31.2: the distributed worker needs mlx 0.32 or newer",
    "the reference implementation is missing (No module named 'mlx_vlm'): scripts/test installs it (requirements-reference.lock)",
])
def test_the_reasons_this_suite_gives_in_the_pins_venv_are_expected(reason):
    assert not unexpected(reason)


def test_a_reason_of_a_missing_install_is_not_expected():
    assert unexpected("`nix-instantiate` is not on PATH (Debian: apt-get install nix-bin; `.ci/run` installs it)")
    assert unexpected("needs Debian's `chromium` and `chromium-driver` on PATH")
    assert all(e.why for e in EXPECTED)


def test_skip_reason_reads_pytests_report_shape():
    class Report:
        skipped = True
        longrepr = ("x.py", 3, "Skipped: why")

    assert skip_reason(Report()) == "why"
    Report.skipped = False
    assert skip_reason(Report()) is None
