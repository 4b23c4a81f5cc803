"""The `mtpstack` command. Each subcommand lives with the component it drives and
is imported only when used, so `mtpstack validate` never loads mlx."""

from __future__ import annotations

import argparse
import importlib
import sys

from mtpstack.errors import UserError, print_error

#: subcommand -> module exposing `register(subparsers)`; the module sets `func` on its parser.
SUBCOMMANDS: dict[str, str] = {
    "validate": "mtpstack.validator.cli",
    "schema": "mtpstack.validator.cli",
    "up": "mtpstack.commands",
    "status": "mtpstack.commands",
    "worker": "mtpstack.worker.cli",
    "weights": "mtpstack.worker.cli",
    "proxy": "mtpstack.proxy.cli",
    "bench": "mtpstack.bench.cli",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    from mtpstack import __version__

    parser = argparse.ArgumentParser(prog="mtpstack", description="Serve MLX models with MTP speculative decoding.")
    parser.add_argument("--version", action="version", version=f"mtpstack {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    # Import only the module of the command asked for; all of them for --help.
    modules = {SUBCOMMANDS[wanted]} if wanted in SUBCOMMANDS else set(SUBCOMMANDS.values())
    for module in dict.fromkeys(SUBCOMMANDS.values()):
        if module in modules:
            importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        return print_error(e)
    except KeyboardInterrupt:
        return 130
