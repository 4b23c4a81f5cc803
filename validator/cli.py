"""`mtpstack validate` and `mtpstack schema`."""

from __future__ import annotations

import argparse
import json
import sys

from mtpstack.validator.config import FleetConfig
from mtpstack.validator.findings import Finding, format_finding
from mtpstack.validator.load import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="check a fleet config", description="Check a fleet config (YAML or JSON).")
    p.add_argument("file", help="the config file")
    p.add_argument("--deep", action="store_true", help="also compare local model directories with what the config says")
    p.add_argument("--strict", action="store_true", help="treat warnings as errors (exit 1)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.set_defaults(func=run_validate)

    s = subparsers.add_parser("schema", help="print the config's JSON Schema", description="Print the JSON Schema of the config, for editors.")
    s.set_defaults(func=run_schema)


#: Exit status when `validate` itself failed: distinct from 1 (invalid) and 2 (unreadable), so
#: CI can tell a crash from a rejection (`mtpstack status` uses 3 for "unhealthy" the same way).
INTERNAL_ERROR = 3


def run_validate(args: argparse.Namespace) -> int:
    try:
        _, report = load_config(args.file, deep=args.deep)
    except Exception as e:  # a bug of ours, whatever the input: a finding, never a traceback
        return _internal_error(args, e)
    if args.format == "json":
        print(report.render_json())
    else:
        text = report.render_text()
        if text:
            print(text)
        errors, warnings = len(report.errors), len(report.warnings)
        if report.ok:
            summary = f"{args.file}: valid" + (f", {warnings} warning{'s' * (warnings != 1)}" if warnings else "")
        else:
            summary = f"{args.file}: invalid, {errors} error{'s' * (errors != 1)}" + (
                f", {warnings} warning{'s' * (warnings != 1)}" if warnings else ""
            )
        print(summary, file=sys.stderr)
    return report.exit_code(strict=args.strict)


def _internal_error(args: argparse.Namespace, error: Exception) -> int:
    finding = Finding.error(code="internal-error", path=(),
                            message=f"the validator failed on this file: {type(error).__name__}: {str(error)[:200]}",
                            hint="this is a bug in mtpstack, not in the config; please report it with the file")
    if args.format == "json":
        print(json.dumps({"ok": False, "errors": [finding.to_json()], "warnings": []}, indent=2))
    else:
        print(format_finding(args.file, finding), file=sys.stderr)
    return INTERNAL_ERROR


def config_schema() -> dict:
    schema = FleetConfig.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "mtpstack fleet config"
    return schema


def run_schema(args: argparse.Namespace) -> int:
    print(json.dumps(config_schema(), indent=2))
    return 0
