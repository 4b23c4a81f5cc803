"""Local training text for the demo models: code and prose found on any Debian machine.

No network is needed: code is Python's own standard library sources, prose is the package
documentation under /usr/share/doc and the licence texts under /usr/share/common-licenses.
Files are read in sorted path order so that one machine always yields the same text.
"""

from __future__ import annotations

import gzip
import sysconfig
from collections.abc import Iterator
from pathlib import Path

PROSE_ROOTS = (Path("/usr/share/common-licenses"), Path("/usr/share/doc"))
# Suffixes under /usr/share/doc that hold running text rather than markup, images or examples.
PROSE_SUFFIXES = {"", ".txt", ".md", ".rst", ".gz", ".Debian"}
# One long changelog or licence must not drown out the rest.
MAX_FILE_CHARS = 24_000


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _read(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    if "\x00" in text or not text.strip():
        return None
    return text[:MAX_FILE_CHARS]


def code_texts() -> Iterator[str]:
    """Python standard library modules, tests and vendored packages left out."""
    root = stdlib_dir()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3"} for p in rel):
            continue
        text = _read(path)
        if text:
            yield text


def prose_texts() -> Iterator[str]:
    """Licences, READMEs, copyright files and changelogs from the installed packages."""
    for root in PROSE_ROOTS:
        if not root.is_dir():
            continue
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            if path.suffix not in PROSE_SUFFIXES:
                continue
            text = _read(path)
            if text:
                yield text


def sample(texts: Iterator[str], max_chars: int) -> list[str]:
    """Every n-th text (in the original order), n chosen so the whole stays near max_chars."""
    pool = list(texts)
    total = sum(len(t) for t in pool)
    step = max(1, -(-total // max_chars))
    out: list[str] = []
    used = 0
    for text in pool[::step]:
        if used + len(text) > max_chars:
            break
        out.append(text)
        used += len(text)
    return out
