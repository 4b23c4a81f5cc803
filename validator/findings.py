"""Findings (one problem at one place in the config) and the report that collects them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

#: `note`: what a check found that is no problem (`--deep`'s MTP family and layout), never fails a run.
Severity = Literal["error", "warning", "note"]
Path = tuple[str, ...]


#: Every finding's code, the one list (JSON output, `--deep`, docs and tests read it): a new rule adds its code here.
CODES = frozenset({
    "backend-forbidden", "bits-mismatch", "concurrency-mismatch", "context-beyond-model", "depth-class-name",
    "depth-map-no-default", "distributed-deploy-on", "distributed-duplicate-host", "distributed-ibv-devices", "distributed-needs-ip",
    "distributed-needs-native", "distributed-no-prefix-cache", "drafter-kind-mismatch", "drafter-precision", "duplicate-key", "host-memory-exceeded",
    "host-runs-nothing", "internal-error", "invalid-type", "invalid-value", "max-depth-below-fixed", "max-depth-unused", "memory-check-skipped", "missing-key",
    "mlx-lm-cannot-cap-context", "mlx-lm-cannot-load-mtp", "mlx-lm-depth-auto", "mlx-lm-depth-map", "mlx-lm-serializes-drafts",
    "model-config-missing", "mtp-family", "mtp-family-not-served", "mtp-head-mismatch", "out-of-range", "port-conflict", "prefix-cache-dir-shared", "prefix-cache-disk-space", "proxy-not-placed",
    "recurrent-draft-model", "api-keys-file", "tenant-beyond-fleet", "tenant-name", "tenant-without-key", "unknown-host", "unknown-key", "unknown-model-limit", "unreadable", "vocab-mismatch",
    "worker-unreachable",
})


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    path: Path
    message: str
    hint: str | None = None
    related: tuple[Path, ...] = ()
    line: int | None = None
    #: Lines of the `related` paths in the source file, where known (text output only).
    related_lines: tuple[int | None, ...] = ()

    @classmethod
    def error(cls, code: str, path: Path, message: str, hint: str | None = None, **more) -> Finding:
        """A finding that fails the run."""
        return cls(code=code, severity="error", path=path, message=message, hint=hint, **more)

    @classmethod
    def warning(cls, code: str, path: Path, message: str, hint: str | None = None, **more) -> Finding:
        """A finding that fails the run only under `--strict`."""
        return cls(code=code, severity="warning", path=path, message=message, hint=hint, **more)

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "path": list(self.path),
            "line": self.line,
            "message": self.message,
            "hint": self.hint,
            "related": [list(p) for p in self.related],
        }


@dataclass
class Report:
    source: str
    findings: list[Finding] = field(default_factory=list)
    unreadable: bool = False

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "note"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def sort(self) -> None:
        """Order findings by line (stable, so rule order breaks ties); unknown lines last."""
        self.findings.sort(key=lambda f: (f.line is None, f.line or 0))

    def exit_code(self, strict: bool = False) -> int:
        if self.unreadable:
            return 2
        if self.errors or (strict and self.warnings):
            return 1
        return 0

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "errors": [f.to_json() for f in self.errors],
            "warnings": [f.to_json() for f in self.warnings],
            "notes": [f.to_json() for f in self.notes],
        }

    def render_json(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def render_text(self) -> str:
        return "\n".join(format_finding(self.source, f) for f in self.findings)


def display_key(key: str) -> str:
    """A key as it reads in a path: quoted (JSON-style) when it holds a dot, a space,
    a quote or anything unprintable, so every finding stays on one line."""
    if key and key.isprintable() and not any(c in key for c in '. "'):
        return key
    return json.dumps(key)


def display_name(name: str) -> str:
    """A free-form name (model, host) for use inside backticks: as is unless unprintable."""
    return name if name.isprintable() else json.dumps(name)


def format_path(path: Path) -> str:
    """`workers.qwen-mtp.maxNumSeqs`; keys that contain a dot are quoted."""
    return ".".join(display_key(p) for p in path)


def format_finding(source: str, f: Finding) -> str:
    where = f"{source}:{f.line}" if f.line is not None else source
    head = f"{where}: {f.severity}[{f.code}]: "
    if f.path:
        head += f"{format_path(f.path)}: "
    text = head + f.message
    for path, line in zip(f.related, f.related_lines):
        if line is not None:
            text += f"\n  related: {source}:{line}: {format_path(path)}"
    if f.hint:
        text += f"\n\nhint: {f.hint}\n"
    return text
