"""`mtpstack up` and `mtpstack status`: the whole stack from one config file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from mtpstack.up import DEFAULT_RUN_DIR

    up = subparsers.add_parser(
        "up",
        help="start every worker and the proxy from a config, and keep them up",
        description="Validate the fleet, start each worker with its weights on its command line, wait until all "
        "are healthy, then start the proxy. Without FILE: the bundled demo (a tiny target with its drafter). "
        "Ctrl-C stops the proxy, then the workers.",
    )
    up.add_argument("file", nargs="?", type=Path, help="the fleet config (YAML or JSON); default: the bundled demo")
    up.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR, help=f"logs and state (default: {DEFAULT_RUN_DIR})")
    up.add_argument("--health-timeout", type=float, default=300.0, metavar="SECONDS", help="how long a process may take to become ready (default: 300)")
    up.add_argument(
        "--host",
        metavar="NAME",
        help="run the parts placed on this host (a name under `hosts`); default: the host named like this machine, "
        "or everything when nothing is placed",
    )
    up.set_defaults(func=run_up)

    st = subparsers.add_parser("status", help="show the processes of a `mtpstack up` run", description="Show each process of a run: pid, health, in-flight requests and the weights it proved.")
    st.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR, help=f"the run to inspect (default: {DEFAULT_RUN_DIR})")
    st.add_argument("--format", choices=("text", "json"), default="text")
    st.set_defaults(func=run_status)


def run_up(args: argparse.Namespace) -> int:
    from mtpstack.up import run_up as up

    return up(args.file, args.run_dir, args.health_timeout, args.host)


def run_status(args: argparse.Namespace) -> int:
    from mtpstack.status import collect, render

    status = collect(args.run_dir)  # a `StatusError` is printed by `mtpstack.cli.main`
    if args.format == "json":
        print(json.dumps(status, indent=2))
    else:
        print("\n".join(render(status)))
    healthy = status["proxy"]["ready"] and all(w["health"] == 200 for w in status["workers"].values())
    return 0 if healthy else 3
