"""API keys: read at start and on SIGHUP (`mtpstack.proxy.tenants`), looked up by a keyed digest, never logged."""

from __future__ import annotations

from aiohttp import hdrs
from multidict import CIMultiDictProxy

from mtpstack.validator import KeysFileError, read_keys_file

#: The keys file cannot be used; the message names the file and its lines, never a key.
ApiKeysError = KeysFileError
#: The key lines of `proxy.apiKeysFile`: `NAME KEY`, or a key alone for tenant `default`; blank lines
#: and `#` comments skipped (the validator's one reader of the format).
load_api_keys = read_keys_file


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
