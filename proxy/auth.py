"""API keys: read once at start, compared in constant time, never logged."""

from __future__ import annotations

import hmac
from pathlib import Path

from aiohttp import hdrs
from multidict import CIMultiDictProxy

from mtpstack.errors import UserError


class ApiKeysError(UserError):
    """The keys file cannot be used; the message names the file, never a key."""


def load_api_keys(path: str | Path) -> tuple[bytes, ...]:
    """One key per line; blank lines and lines starting with `#` are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ApiKeysError(f"cannot read the API keys file `{path}`: {e.strerror or e}", "check `proxy.apiKeysFile`") from None
    except UnicodeDecodeError:
        raise ApiKeysError(f"the API keys file is not UTF-8 text: `{path}`") from None
    keys = tuple(
        line.strip().encode() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )
    if not keys:
        raise ApiKeysError(f"the API keys file holds no keys: `{path}`", "write one key per line, or set `proxy.apiKeysFile` to null")
    return keys


def presented_key(headers: CIMultiDictProxy[str]) -> bytes | None:
    """The key from `Authorization: Bearer KEY` (what OpenAI clients send) or `X-Api-Key`."""
    auth = headers.get(hdrs.AUTHORIZATION)
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip().encode()
        return None
    key = headers.get("X-Api-Key")
    return key.strip().encode() if key and key.strip() else None


def key_accepted(presented: bytes | None, keys: tuple[bytes, ...]) -> bool:
    """Constant time in the key's content: every configured key is compared, no early exit."""
    if presented is None:
        return False
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(presented, key)
    return ok
