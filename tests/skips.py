"""Which skips a run may have, and the summary that names every skip by its reason.

`./scripts/test` installs everything the suite needs on Linux, so in CI (`CI` set, as `.ci/run` sets
it) a skip means a test did not run for a reason nobody decided: a missing install, a new guard.
`EXPECTED` is the one list of reasons a skip may give on Linux (README's "Tests" lists the same);
`tests/conftest.py` hooks this module into pytest: the run ends with its skips grouped by reason,
and under CI a skip whose reason matches none of `EXPECTED` fails the run.

Tests that need something the project's scripts install call `require` instead of `pytest.skip`:
outside CI it skips, naming the fix; in CI it fails the test where it stands.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Expected:
    """A skip reason a run on Linux may give (`pattern`, searched in the reason), and why it is fine."""

    pattern: str
    why: str

    def matches(self, reason: str) -> bool:
        return re.search(self.pattern, reason) is not None


#: Every skip reason a Linux run may give. Anything else is a test CI did not run for no decided reason.
EXPECTED = [
    Expected(r"JACCL may be available on a Mac", "macOS only: a Mac may have JACCL (skipped there, runs on Linux)"),
    Expected(r"is not a local address here \(Linux routes all of 127/8",
             "macOS only: a second loopback address is not configured there (skipped there, runs on Linux)"),
    Expected(r"gather_qmm takes no `global_scale`",
             "the nixpkgs-pins venv: its mlx (0.31.2 on Linux) cannot run mlx-lm's quantized MoE layers"),
    Expected(r"the distributed worker needs mlx \S+ or newer",
             "the nixpkgs-pins venv: its mlx is older than the distributed worker accepts (the refusal is tested)"),
    Expected(r"the reference implementation is missing",
             "the nixpkgs-pins venv: it holds the Nix package's versions only, not the reference (mlx-vlm); "
             "in CI the main run fails without it (`tests/reference.py`)"),
]


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def require(message: str, *, allow_module_level: bool = False) -> None:
    """Something `scripts/test` installs is missing: a failure in CI, a skip naming the fix elsewhere."""
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=allow_module_level)


def skip_reason(report) -> str | None:
    """The reason of a skipped test or collector's report (None: not a skip, or an xfail)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def unexpected(reason: str) -> bool:
    return not any(e.matches(reason) for e in EXPECTED)


class SkipLedger:
    """The run's skips, by reason (registered by tests/conftest.py as the plugin `skip-ledger`)."""

    def __init__(self) -> None:
        self.by_reason: dict[str, list[str]] = defaultdict(list)

    def _add(self, report) -> None:
        reason = skip_reason(report)
        if reason is not None:
            self.by_reason[reason].append(report.nodeid)

    def pytest_runtest_logreport(self, report) -> None:
        self._add(report)

    def pytest_collectreport(self, report) -> None:
        self._add(report)

    @property
    def unexpected(self) -> dict[str, list[str]]:
        return {r: ids for r, ids in self.by_reason.items() if unexpected(r)}

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.by_reason:
            return
        tr = terminalreporter
        total = sum(len(ids) for ids in self.by_reason.values())
        tr.write_sep("=", f"skipped tests by reason ({total} in {len(self.by_reason)} reasons)")
        for reason, ids in sorted(self.by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            mark = "expected" if not unexpected(reason) else "NOT EXPECTED"
            tr.write_line(f"[{len(ids)}] {mark}: {reason}")
            for nodeid in sorted(ids):
                tr.write_line(f"    {nodeid}")
        if self.unexpected:
            verdict = "fail this run (CI is set)" if in_ci() else "would fail it in CI"
            tr.write_line(f"{sum(map(len, self.unexpected.values()))} skips have a reason not in tests/skips.py's "
                          f"EXPECTED: they {verdict}; install what they need or name the reason there", red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        # OK (0) and "no tests ran" (5) become a failure; an interrupted or broken run keeps its own status.
        if in_ci() and self.unexpected and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
