"""From a file (or plain data) to a validated `FleetConfig` and a `Report` of findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from mtpstack.validator import rules
from mtpstack.validator.config import FleetConfig
from mtpstack.validator.findings import Finding, Report, display_key, format_path
from mtpstack.validator.source import Source, Unreadable, read_source

_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "a mapping",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "is_instance_of": "a mapping",
}
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


class ConfigError(Exception):
    """A config that must not be used; `report` holds the findings and `str()` renders them."""

    def __init__(self, report: Report):
        self.report = report
        super().__init__(report.render_text())


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"{json.dumps(shown)} (a string)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class that owns the key at `loc` (loc ends with that key)."""
    model: Any = FleetConfig
    i = 0
    parts = loc[:-1]
    while i < len(parts):
        field = next(
            (f for name, f in model.model_fields.items() if (f.alias or name) == parts[i]),
            None,
        )
        if field is None:
            return None
        annotation = field.annotation
        origin = getattr(annotation, "__origin__", None)
        args = getattr(annotation, "__args__", ())
        if origin is dict:  # dict[str, Model]: skip the key
            annotation = args[1]
            i += 1
        else:
            annotation = next((a for a in (args or (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel)), annotation)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
        i += 1
    return model


def _keys_of(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _is_depth_tag(part) -> bool:
    """pydantic's tag for a branch of `drafter.depth` (a number, `auto`, or a depth per class) in an error's path."""
    return isinstance(part, str) and (part in ("int", "literal['auto']") or part.startswith("dict[str,"))


def _untag_depth(errors: list[dict]) -> list[dict]:
    """Errors of `drafter.depth` as one per value, without pydantic's branch tags: a mapping is judged as a
    map, anything else as a depth, and a value that is neither a number nor `auto` is one `depth_type` error."""
    out, seen = [], set()
    for err in errors:
        loc = tuple(err["loc"])
        at = next((i for i in range(2, len(loc)) if loc[i - 2 : i] == ("drafter", "depth")), None)
        if at is None or not any(_is_depth_tag(p) for p in loc[at:]):
            out.append(err)
            continue
        if err["type"] == "dict_type" or (isinstance(err.get("input"), dict) and not str(loc[-1]).startswith("dict[")):
            continue  # the other branch's complaint about the same value
        untagged = loc[:at] + tuple(p for p in loc[at:] if not _is_depth_tag(p))
        if untagged in seen:
            continue
        seen.add(untagged)
        kind = "depth_type" if err["type"] in ("int_type", "literal_error") else err["type"]
        out.append({**err, "loc": untagged, "type": kind})
    return out


def _structural(err: dict, source: Source) -> Finding:
    loc = tuple(str(p) for p in err["loc"])
    kind = err["type"]
    value = err.get("input")
    line = source.line_of(loc)
    if kind == "extra_forbidden":
        owner = _model_at(loc)
        known = _keys_of(owner) if owner else []
        guess = rules.did_you_mean(loc[-1], known)
        where = format_path(loc[:-1]) or "the top level"
        return Finding.error(code="unknown-key", path=loc, message=f"unknown key `{display_key(loc[-1])}` in {where}",
                             hint=f"did you mean `{guess}`?" if guess else ("known keys: " + ", ".join(f"`{k}`" for k in known) if known else None),
                             line=line)
    if kind == "missing":
        return Finding.error(code="missing-key", path=loc, message=f"required key `{display_key(loc[-1])}` is missing",
                             hint=f"add `{loc[-1]}` under `{format_path(loc[:-1])}`" if len(loc) > 1 else None, line=line)
    if kind in _RANGE_ERRORS:
        limit = err.get("ctx", {})
        bound = next(iter(limit.values()), None)
        relation = {
            "greater_than": "greater than",
            "greater_than_equal": "at least",
            "less_than": "less than",
            "less_than_equal": "at most",
        }[kind]
        return Finding.error(code="out-of-range", path=loc, message=f"must be {relation} {bound}, got: {_describe(value)}",
                             line=line)
    if kind == "literal_error":
        expected = str(err.get("ctx", {}).get("expected", "")).replace("'", "").replace(" or ", ", ")
        hint = None
        if isinstance(value, str) and value.isdigit() and value in expected.split(", "):
            hint = f"write {value} without quotes"
        return Finding.error(code="invalid-value", path=loc, message=f"must be one of: {expected}; got: {_describe(value)}",
                             hint=hint, line=line)
    if kind == "depth_type":
        hint = "write the number without quotes" if isinstance(value, str) and value.strip().isdigit() else None
        return Finding.error(code="invalid-type", path=loc,
                             message=f"expected a draft depth (a number of tokens or `auto`), got: {_describe(value)}",
                             hint=hint, line=line)
    if kind in _TYPE_NAMES:
        hint = None
        if isinstance(value, str) and kind in {"int_type", "float_type"} and value.strip().lstrip("-").replace(".", "", 1).isdigit():
            hint = "write the number without quotes"
        return Finding.error(code="invalid-type", path=loc, message=f"expected {_TYPE_NAMES[kind]}, got: {_describe(value)}",
                             hint=hint, line=line)
    return Finding.error(code="invalid-value", path=loc,
                         message=f"{err['msg'][0].lower()}{err['msg'][1:]}, got: {_describe(value)}", line=line)


def validate_data(data: Any, source_name: str = "<config>", source: Source | None = None) -> tuple[FleetConfig | None, Report]:
    """Validate plain data (as parsed from YAML or JSON). The config is None when it has errors
    that keep it from being built; a built config may still carry rule errors in the report."""
    source = source or Source(data=data)
    report = Report(source=source_name)
    for path, first, again in source.duplicates:
        report.findings.append(
            Finding.error(code="duplicate-key", path=path,
                          message=f"key `{display_key(path[-1])}` appears twice{f' (lines {first} and {again})' if first else ''}; only the last would count",
                          hint="remove one of them", line=again)
        )
    if not isinstance(data, dict):
        report.findings.append(
            Finding.error(code="invalid-type", path=(),
                          message=f"the config must be a mapping with `proxy`, `policy` and `workers`, got: {_describe(data)}",
                          hint="start from `examples/valid/fleet.yaml`, or print the schema with `mtpstack schema`",
                          line=1 if source.lines or data is not None else None)
        )
        return None, report
    try:
        config = FleetConfig.model_validate(data)
    except ValidationError as e:
        report.findings.extend(_structural(err, source) for err in _untag_depth(e.errors()))
        report.sort()
        return None, report
    for f in rules.check(config):
        report.findings.append(_with_line(f, source))
    report.sort()
    return config, report


def _with_line(f: Finding, source: Source) -> Finding:
    from dataclasses import replace

    return replace(
        f,
        line=source.line_of(f.path),
        related_lines=tuple(source.lines.get(tuple(p)) for p in f.related),
    )


def load_config(file: str | Path, deep: bool = False) -> tuple[FleetConfig | None, Report]:
    """Read and validate a config file. Never raises for bad input: problems are findings."""
    name = str(file)
    try:
        source = read_source(file)
    except Unreadable as e:
        report = Report(source=name, unreadable=True)
        report.findings.append(Finding.error(code="unreadable", path=(), message=e.message, hint=e.hint, line=e.line))
        return None, report
    config, report = validate_data(source.data, name, source)
    if deep and config is not None:
        from mtpstack.validator.deep import check_deep
        from mtpstack.validator.memory import check_memory

        base = Path(file).resolve().parent
        report.findings.extend(_with_line(f, source) for f in [*check_deep(config, base), *check_memory(config, base)])
    return config, report


def validate_file(file: str | Path, deep: bool = False) -> Report:
    return load_config(file, deep=deep)[1]


def load_valid_config(file: str | Path, deep: bool = False) -> FleetConfig:
    """The config every component starts from: raises `ConfigError` unless it is free of errors."""
    config, report = load_config(file, deep=deep)
    if config is None or not report.ok:
        raise ConfigError(report)
    return config
