"""Imported first by every script here: puts the checkout's root on `sys.path` so a script run by
path (`python bench/scripts/NAME.py`) finds `devkit`, the development support that is not installed."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
