"""`mtpstack validate` and `mtpstack schema`."""

from __future__ import annotations

import argparse
import json
import sys

from validator.config import FleetConfig
from validator.load import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="check a fleet config", description="Check a fleet config (YAML or JSON).")
    p.add_argument("file", help="the config file")
    p.add_argument("--deep", action="store_true", help="also compare local model directories with what the config says")
    p.add_argument("--strict", action="store_true", help="treat warnings as errors (exit 1)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.set_defaults(func=run_validate)

    s = subparsers.add_parser("schema", help="print the config's JSON Schema", description="Print the JSON Schema of the config, for editors.")
    s.set_defaults(func=run_schema)


def run_validate(args: argparse.Namespace) -> int:
    _, report = load_config(args.file, deep=args.deep)
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


def config_schema() -> dict:
    schema = FleetConfig.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "mtpstack fleet config"
    return schema


def run_schema(args: argparse.Namespace) -> int:
    print(json.dumps(config_schema(), indent=2))
    return 0
