"""Which event loop `mtpstack proxy` runs on: uvloop when it is installed, else asyncio's own.

Why uvloop: it runs the loop and its transports in C on libuv. Measured with
`bench/scripts/load_bench.py proxy --loops uvloop,asyncio` (both proxies in the same interleaved rounds;
docs/proxy.md, Overhead), it takes about a sixth off the proxy's CPU per chunk of a paced stream (a
model writing tokens), where the loop's own work per chunk is most of the cost, and nothing
measurable off a plain request, whose cost is aiohttp's and the proxy's Python. Nothing in the proxy
depends on which loop runs: asyncio's stays a choice (`--loop asyncio`) and the fallback where
uvloop is not installed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from mtpstack.errors import UserError

#: `mtpstack proxy --loop`: `auto` takes uvloop when it can be imported.
AUTO, UVLOOP, ASYNCIO = "auto", "uvloop", "asyncio"
CHOICES = (AUTO, UVLOOP, ASYNCIO)


@dataclass(frozen=True)
class EventLoop:
    """The loop to run: its name, the factory for `asyncio.Runner` (None: asyncio's default) and,
    when asyncio runs although uvloop was not declined, why."""

    name: str
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    fallback_reason: str | None = None


def choose(wanted: str = AUTO) -> EventLoop:
    """The loop for `--loop wanted`. Raises `UserError` when uvloop is asked for by name and cannot be imported."""
    if wanted == ASYNCIO:
        return EventLoop(ASYNCIO)
    try:
        import uvloop
    except ImportError as e:
        if wanted == UVLOOP:
            raise UserError(f"`--loop uvloop` was asked for, but uvloop cannot be imported: {e}",
                            "install it (`pip install uvloop`), or pass `--loop asyncio`") from None
        return EventLoop(ASYNCIO, fallback_reason=f"uvloop cannot be imported ({e}); `pip install uvloop` to run on it")
    return EventLoop(UVLOOP, uvloop.new_event_loop)


def running_loop_name() -> str:
    """`uvloop` or `asyncio`: what the running loop is, read from the loop itself."""
    return UVLOOP if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else ASYNCIO
