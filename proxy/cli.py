"""`mtpstack proxy --config FILE`: validate the fleet config, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from aiohttp import web

from mtpstack.errors import print_error
from mtpstack.logs import configure as configure_logs
from mtpstack.proxy.app import create_app
from mtpstack.proxy.auth import ApiKeysError
from mtpstack.proxy.eventloop import AUTO, CHOICES, EventLoop, choose, running_loop_name
from mtpstack.proxy.state import STATE
from mtpstack.validator import MAX_HEADER_BYTES, ConfigError, FleetConfig, load_config

log = logging.getLogger("mtpstack.proxy")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "proxy",
        help="run the admission proxy in front of the workers",
        description="Serve the OpenAI API on `proxy.host:proxy.port`, admitting each request to a worker of its model "
        "and never sending a worker more requests at once than its gate.",
    )
    p.add_argument("--config", required=True, metavar="FILE", help="the fleet config (YAML or JSON)")
    p.add_argument("--loop", choices=CHOICES, default=AUTO,
                   help="the event loop: uvloop when it is installed (`auto`, the default), or asyncio's own; "
                        "the `listening` log line says which runs")
    p.set_defaults(func=run)


def load(file: str) -> FleetConfig:
    """The validator's loader (what `load_valid_config` does), keeping the report so that
    warnings are shown too. Raises `ConfigError` on any error."""
    config, report = load_config(file)
    if config is None or not report.ok:
        raise ConfigError(report)
    if report.warnings:
        print(report.render_text(), file=sys.stderr)
    return config


def run(args: argparse.Namespace) -> int:
    try:
        config = load(args.config)
    except ConfigError as e:
        text = str(e)
        if text:
            print(text, file=sys.stderr)
        n = len(e.report.errors)
        return print_error(f"not starting the proxy: the config has {n} error{'s' * (n != 1)}: `{args.config}`")
    event_loop = choose(args.loop)  # a `UserError` is printed by `mtpstack.cli.main`
    configure_logs()
    app = create_app(config)  # an `ApiKeysError` is printed by `mtpstack.cli.main`
    try:
        with asyncio.Runner(loop_factory=event_loop.factory) as runner:
            return runner.run(serve(app, config, event_loop, config_file=args.config))
    except OSError as e:
        return print_error(f"cannot listen on {config.proxy.host}:{config.proxy.port}: {e.strerror or e}", "change `proxy.port` or stop what uses it")


async def reload_tenants(app: web.Application, config_file: str) -> bool:
    """SIGHUP: read the config and the keys file again and take their keys and tenants; the rest of
    the config needs a restart. A config the validator refuses, or a keys file that cannot be used,
    keeps the set in effect, and the log says why. Requests in flight keep the tenant they came as.
    The files are read and checked in a thread (a keys file of 100,000 tenants takes seconds), so the
    proxy keeps serving meanwhile; the new set is taken in one step on the event loop."""
    state = app[STATE]

    def read():
        config, report = load_config(config_file)
        if config is None or not report.ok:
            return None, report, None
        return config, report, state.tenants.prepare(config)

    try:
        config, report, digests = await asyncio.to_thread(read)
    except ApiKeysError as e:
        log.error(json.dumps({"event": "reload_failed", "reason": f"{e}; the keys and tenants in effect are kept"}))
        return False
    if config is None:
        log.error(json.dumps({"event": "reload_failed", "reason": "the config has errors; the keys and tenants in effect are kept",
                              "report": report.render_text()}))
        return False
    state.tenants.install(config, digests)
    log.info(json.dumps({"event": "reloaded", "tenants": len(config.proxy.tenants), "keys": state.tenants.keys,
                         "warnings": [f.message for f in report.warnings]}))
    return True


def _on_sighup(app: web.Application, config_file: str, reloads: list) -> None:
    """One reload at a time: a signal during one runs another after it (the files may have changed again)."""
    previous = reloads[0] if reloads else None

    async def after_previous() -> None:
        if previous is not None:
            await asyncio.wait([previous])
        await reload_tenants(app, config_file)

    reloads[:] = [asyncio.get_running_loop().create_task(after_previous())]


async def serve(app: web.Application, config: FleetConfig, event_loop: EventLoop | None = None, config_file: str | None = None) -> int:
    p = config.proxy
    # Client disconnects cancel the handler, which closes the upstream request and frees the
    # slot at once. On a stop signal: close the socket, let in-flight requests finish up to
    # the grace period, then cancel what is left.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=p.shutdown_grace_seconds,
                           max_field_size=MAX_HEADER_BYTES)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config_file is not None:
        loop.add_signal_handler(signal.SIGHUP, _on_sighup, app, config_file, [])
    state = app[STATE]
    server = None
    try:
        # Not `web.TCPSite`: each connection's protocol is wrapped in its client deadline.
        assert runner.server is not None and state.deadlines is not None
        server = await loop.create_server(state.deadlines.protocol_factory(runner.server), p.host, p.port, reuse_address=True)
        listening = {
            "event": "listening",
            "url": f"http://{p.host}:{p.port}",
            "event_loop": running_loop_name(),
            "workers": {u.name: {"model": u.model, "url": u.url, "gate": u.gate, "healthy": u.healthy} for u in state.upstreams.values()},
        }
        if event_loop is not None and event_loop.fallback_reason:
            listening["event_loop_fallback"] = event_loop.fallback_reason
        log.info(json.dumps(listening))
        await stop.wait()
        inflight = sum(u.inflight for u in state.upstreams.values()) + sum(a.waiting for a in state.admissions.values())
        log.info(json.dumps({"event": "draining", "in_flight": inflight, "grace_seconds": p.shutdown_grace_seconds}))
    finally:
        if server is not None:
            server.close()
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    log.info(json.dumps({"event": "stopped"}))
    return 0
