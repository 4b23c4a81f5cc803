"""A process whose command line is a given argv (it only sleeps): for tests that read a worker's
command line from /proc without starting a worker."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mtpstack.runtime import Process

#: /proc/PID/cmdline can read empty for a moment after exec.
CMDLINE_WAIT_S = 5.0


@contextmanager
def sleeping_process(argv: list[str]) -> Iterator[Process]:
    proc = Process([sys.executable, "-c", "import time; time.sleep(120)", *argv], log_path=Path(os.devnull), name="sleeper").start()
    try:
        deadline = time.monotonic() + CMDLINE_WAIT_S
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        while cmdline.exists() and not cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        yield proc
    finally:
        proc.stop(timeout=5)
