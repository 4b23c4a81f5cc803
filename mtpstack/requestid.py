"""The request id both services use: one `X-Request-Id` per request, end to end.

The proxy takes a client's id or mints one, sends it to the worker and echoes it on its answer;
the worker echoes the id it received. Both log it, so one request can be followed through both logs.
"""

from __future__ import annotations

import itertools
import os
import re
from typing import Mapping

REQUEST_ID = "X-Request-Id"
#: A client-chosen request id is kept only if it is short and plain (it lands in logs and headers).
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def request_id(headers: Mapping[str, str]) -> str:
    """The id the request brought, if it is plain enough to log; otherwise a new one."""
    given = headers.get(REQUEST_ID)
    if given and _CLIENT_REQUEST_ID.fullmatch(given):
        return given
    return new_request_id()


def _reseed() -> None:
    global _prefix, _minted
    _prefix, _minted = os.urandom(8).hex(), itertools.count()


_reseed()
os.register_at_fork(after_in_child=_reseed)  # a forked child never mints its parent's ids


def new_request_id() -> str:
    """32 hex digits, as `uuid4().hex` has: 64 random bits drawn once per process, then a counter.
    Unique per process without a system call per request (`uuid4` reads the OS's random source)."""
    return f"{_prefix}{next(_minted):016x}"
