"""`GET /dashboard`: the operator's page, one self-contained HTML file shipped as package data.

The page itself is open; the data it polls (`/v1/fleet/status`) needs the API key when keys are
configured. The page asks for the key, keeps it in page memory only and sends it as a header,
so it never appears in a URL or an access log.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from aiohttp import hdrs, web

#: The page loads nothing from elsewhere (no CDN: it works offline), and runs only its own code.
CONTENT_SECURITY_POLICY = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:"


@cache
def page() -> bytes:
    return files("mtpstack.proxy").joinpath("static/dashboard.html").read_bytes()


async def dashboard(request: web.Request) -> web.Response:
    return web.Response(
        body=page(),
        content_type="text/html",
        charset="utf-8",
        headers={hdrs.CONTENT_SECURITY_POLICY: CONTENT_SECURITY_POLICY, hdrs.CACHE_CONTROL: "no-cache"},
    )
