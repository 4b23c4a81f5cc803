"""The API keys file (`proxy.apiKeysFile`): one `NAME KEY` per line, or a key alone (tenant `default`).

The one reader of its format: the validator checks it (`check_keys_file`), the proxy loads it at start
and on SIGHUP (`mtpstack.proxy.tenants`). Errors name the file and its line numbers, never a key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mtpstack.errors import UserError
from mtpstack.validator.config import TENANT_NAME_PATTERN

#: The tenant of a line that holds a key alone (the file's format before tenants).
DEFAULT_TENANT = "default"
#: A file larger than this is refused before it is read: 100,000 tenants with 200-byte keys fit.
MAX_FILE_BYTES = 32 * 1024 * 1024
#: A key longer than this is refused (a line is a key, not a document).
MAX_KEY_BYTES = 4096
#: What a key may hold: visible ASCII, as an HTTP header carries it (`Authorization: Bearer KEY`).
_KEY = re.compile(rb"[\x21-\x7e]+")
_NAME = re.compile(TENANT_NAME_PATTERN.encode())


class KeysFileError(UserError):
    """The keys file cannot be used: `message` names the file and the lines, never a key; `hint` the fix."""


@dataclass(frozen=True)
class KeyLine:
    tenant: str
    key: bytes
    line: int
    #: The line named its tenant (`NAME KEY`), rather than holding a key alone.
    named: bool


def read_keys_file(path: str | Path) -> list[KeyLine]:
    """Every key line of the file, in order. Raises `KeysFileError` for a file that cannot be read, is
    too large or not UTF-8, holds a malformed line, a duplicate key or a name given twice, or no key."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise KeysFileError(f"cannot read the API keys file `{path}`: {e.strerror or e}", "check `proxy.apiKeysFile`") from None
    if len(data) > MAX_FILE_BYTES:
        raise KeysFileError(f"the API keys file `{path}` is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB",
                            "keep one `NAME KEY` line per tenant key in it")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise KeysFileError(f"the API keys file is not UTF-8 text: `{path}` line {line}", "save it as UTF-8") from None
    return parse_keys(data, str(path))


def parse_keys(data: bytes, path: str = "the API keys file") -> list[KeyLine]:
    lines: list[KeyLine] = []
    first_of_key: dict[bytes, int] = {}
    first_of_name: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), 1):
        text = raw.strip()
        if not text or text.startswith(b"#"):
            continue
        fields = text.split()
        where = f"`{path}` line {number}"
        if len(fields) > 2:
            raise KeysFileError(f"{where} has {len(fields)} fields; a line is `NAME KEY` or a key alone, and a key holds no spaces",
                                "write the tenant's name, whitespace, then its key")
        key = fields[-1]
        if len(key) > MAX_KEY_BYTES:
            raise KeysFileError(f"{where} holds a key of {len(key)} bytes, more than {MAX_KEY_BYTES}", "use a shorter key")
        if not _KEY.fullmatch(key):
            raise KeysFileError(f"{where} holds a key with characters other than visible ASCII, which no HTTP header carries",
                                "use keys of letters, digits and punctuation")
        named = len(fields) == 2
        if named:
            name = fields[0]
            if not _NAME.fullmatch(name):
                raise KeysFileError(f"{where}: a tenant name may hold only letters, digits, `_`, `.` and `-` (1-64 characters)",
                                    "rename the tenant")
            tenant = name.decode()
            if tenant in first_of_name:
                raise KeysFileError(f"{where} names tenant `{tenant}` again, already named on line {first_of_name[tenant]}",
                                    "give each tenant one line, or rename one of them")
            first_of_name[tenant] = number
        else:
            tenant = DEFAULT_TENANT
        if key in first_of_key:
            raise KeysFileError(f"{where} repeats the key of line {first_of_key[key]}", "give each tenant a key of its own")
        first_of_key[key] = number
        lines.append(KeyLine(tenant, key, number, named))
    if not lines:
        raise KeysFileError(f"the API keys file holds no keys: `{path}`",
                            "write one `NAME KEY` line per tenant (or a key alone), or set `proxy.apiKeysFile` to null")
    return lines
