"""The worker's HTTP server: the aiohttp app over one generation thread, and `serve`, which runs it.

The event loop parses requests, admits them into at most `max_num_seqs` slots and streams text
back (`mtpstack.worker.handlers`, `mtpstack.worker.answers`); the generation thread owns mlx
(`mtpstack.worker.generation`). The app starts that thread on startup and stops it on cleanup.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from mtpstack.endpoints import ENDPOINTS, REACHABILITY_PATHS
from mtpstack.errors import UserError
from mtpstack.validator import MAX_HEADER_BYTES
from mtpstack.worker import handlers
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.generation import GenerationLoop
from mtpstack.worker.handlers import CONFIG, GEN, METRICS, PARSER, SLOTS
from mtpstack.web import errors_as_json
from mtpstack.worker.http import MAX_BODY_BYTES
from mtpstack.worker.metrics import Metrics
from mtpstack.worker.proof import ModelNotFound

log = logging.getLogger("mtpstack.worker")

#: On SIGTERM, in-flight responses get this long to finish before their connections close.
SHUTDOWN_GRACE = 5.0


def create_app(config: WorkerConfig) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[errors_as_json("worker")])
    app[CONFIG] = config
    app[METRICS] = Metrics(max(config.deepest_draft_depth, 1) if config.draft_model else 0)
    app.cleanup_ctx.append(_generation_ctx)
    for endpoint in ENDPOINTS:
        app.router.add_post(endpoint.path, handlers.route(endpoint))
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_get("/v1/models/{model:.+}", handlers.model)
    app.router.add_get("/health", handlers.health)
    for path in REACHABILITY_PATHS:
        app.router.add_get(path, handlers.reachable)
    app.router.add_get("/identity", handlers.identity)
    app.router.add_get("/metrics", handlers.metrics)
    return app


async def _generation_ctx(app: web.Application):
    config = app[CONFIG]
    if config.distributed_backend is not None:
        from mtpstack.worker.distributed import DistributedGenerationLoop as loop_class
    else:
        loop_class = GenerationLoop
    gen = loop_class(config, app[METRICS], asyncio.get_running_loop())
    app[GEN] = gen
    app[SLOTS] = asyncio.Semaphore(config.max_num_seqs)
    app[PARSER] = ThreadPoolExecutor(1, thread_name_prefix="parse")
    gen.start()
    yield
    gen.stop()
    app[PARSER].shutdown(wait=False, cancel_futures=True)


async def serve(config: WorkerConfig) -> int:
    """Run until SIGTERM/SIGINT. Returns the exit code: 1 when the models failed to load."""
    app = create_app(config)
    # handler_cancellation: a closed connection cancels its handler, which cancels the sequence.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE,
                           max_field_size=MAX_HEADER_BYTES)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise UserError(f"cannot listen on `{config.host}:{config.port}`: {e.strerror or e}",
                        "change the worker's `port` (`--port`) or stop what uses it") from None
    log.info("listening on http://%s:%d (loading models)", config.host, config.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gen = app[GEN]
    code = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.2)
        except asyncio.TimeoutError:
            pass
        if gen.load_error is not None:
            e = gen.load_error
            msg = str(e) if isinstance(e, (ModelNotFound, ValueError, FileNotFoundError)) else f"{type(e).__name__}: {e}"
            log.error("the worker failed to load its models: %s", msg)
            code = 1
            break
    await runner.cleanup()
    return code
