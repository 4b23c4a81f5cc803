"""A process whose command line is a given argv (it only sleeps): for tests that read a worker's
command line from /proc without starting a worker."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: /proc/PID/cmdline can read empty for a moment after exec.
CMDLINE_WAIT_S = 5.0


@contextmanager
def sleeping_process(argv: list[str]) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv])
    try:
        deadline = time.monotonic() + CMDLINE_WAIT_S
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        while cmdline.exists() and not cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()
