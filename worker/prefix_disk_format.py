"""The disk tier's file format and its checks (`mtpstack.worker.prefix_disk` keeps the files).

A node's two files, its stretch (`<key>.kv`) and its end state (`<key>.st`), are each (`LAYOUT` 1):
`MAGIC`, the header's length and CRC-32 (two little-endian u32), the header (JSON: the key, for a
stretch its parent, start and tokens; the tree's skeleton, each array's dtype, shape and offset, and
the arrays' CRC-32), then the arrays' bytes. A reader checks everything it reads: a short, torn,
corrupt or foreign file is a `BadEntry`. The key chains a node's tokens to its parent's
(`chain_key`); the folder of one validity is named by the hash of its facts (`validity_folder`).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The file layout's version: part of every entry's validity, so a change of format never reads old files.
LAYOUT = 1
MAGIC = b"MTPSNAP\x01"
#: A node's stretch (its tokens, the attention and drafter entries over them) and its end state.
KV_SUFFIX = ".kv"
STATE_SUFFIX = ".st"
TMP_SUFFIX = ".tmp"
#: The folder of one validity: `v<LAYOUT>-` and 16 hex digits of the facts' hash.
FOLDER_PREFIX = "v"
_PREFIX = struct.Struct("<II")
#: Numpy's view of each mlx dtype the caches hold; bfloat16 travels as its 16 bits.
_NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "float64": np.float64,
          "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
          "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "bool": np.bool_}


class BadEntry(Exception):
    """A file that is not a whole, valid entry of this tier."""


def chain_key(parent: bytes | None, tokens) -> bytes:
    """The key of the node holding `tokens` below the node keyed `parent` (None: the root): it stands
    for every token from the prompt's start to the node's end."""
    h = hashlib.sha256(b"root" if parent is None else parent)
    h.update(np.asarray(tokens, dtype="<u4").tobytes())
    return h.digest()[:16]


def validity_folder(facts: dict) -> str:
    digest = hashlib.sha256(json.dumps({"layout": LAYOUT, **facts}, sort_keys=True).encode()).hexdigest()
    return f"{FOLDER_PREFIX}{LAYOUT}-{digest[:16]}"


def is_folder_name(name: str) -> bool:
    head, _, digest = name.partition("-")
    return head[:1] == FOLDER_PREFIX and head[1:].isdigit() and len(digest) == 16 and all(c in "0123456789abcdef" for c in digest)


def _dtype_name(array) -> str:
    return str(array.dtype).rsplit(".", 1)[-1]


def flatten(tree, leaves: list) -> object:
    """`tree` (nested lists/tuples of arrays and None) as a JSON skeleton: each array its index in `leaves`."""
    if tree is None:
        return None
    if isinstance(tree, (list, tuple)):
        return [flatten(t, leaves) for t in tree]
    leaves.append(tree)
    return len(leaves) - 1


def unflatten(skeleton, leaves: list) -> object:
    if skeleton is None:
        return None
    if isinstance(skeleton, list):
        return [unflatten(s, leaves) for s in skeleton]
    return leaves[skeleton]


@dataclass
class RawArray:
    """An array read from disk, not yet in mlx: numpy's bytes and the mlx dtype they are."""

    data: np.ndarray
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def to_mlx(tree):
    """A tree read from disk with mlx arrays at its leaves (a copy of each; bfloat16 viewed on the CPU)."""
    import mlx.core as mx

    if tree is None:
        return None
    if isinstance(tree, list):
        return [to_mlx(t) for t in tree]
    array = mx.array(tree.data)
    return array.view(getattr(mx, tree.dtype), stream=mx.cpu) if tree.dtype == "bfloat16" else array


@dataclass
class Loaded:
    """A chain read back: each entry's tokens and stretch (None where the caller holds it), the last one's end state."""

    tokens: list[tuple[int, ...]]
    segments: list[object]
    end_state: object


def in_mlx(loaded: "Loaded") -> "Loaded":
    """`loaded` with mlx arrays, evaluated on the thread that calls this (the tier's, through `load`'s
    `convert`): mlx (0.31.2 and later) gives each thread its own streams, and an array evaluated on one
    is an input like any other on the generation thread's, while an unevaluated one would not be."""
    import mlx.core as mx

    segments = [to_mlx(s) for s in loaded.segments]
    end_state = to_mlx(loaded.end_state)
    mx.eval(segments, end_state)
    return Loaded(loaded.tokens, segments, end_state)


@dataclass
class Payload:
    """A tree's arrays as the buffers to write: its skeleton, each array's dtype and shape, their bytes."""

    skeleton: object
    views: list[memoryview]
    dtypes: list[str]
    shapes: list[list[int]]

    @classmethod
    def of(cls, tree) -> "Payload":
        leaves: list = []
        skeleton = flatten(tree, leaves)
        return cls(skeleton, [memoryview(a) for a in leaves], [_dtype_name(a) for a in leaves], [list(a.shape) for a in leaves])

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.views)

    def encode(self, fields: dict) -> list:
        """The file's parts: `MAGIC`, the header's length and CRC, the header, the arrays."""
        arrays, offset = [], 0
        for v, dtype, shape in zip(self.views, self.dtypes, self.shapes):
            arrays.append([dtype, shape, offset, v.nbytes])
            offset += v.nbytes
        crc = 0
        for v in self.views:
            crc = zlib.crc32(v, crc)
        header = json.dumps({**fields, "skeleton": self.skeleton, "arrays": arrays, "crc": crc}, separators=(",", ":")).encode()
        return [MAGIC, _PREFIX.pack(len(header), zlib.crc32(header)), header, *self.views]



def parent_of(header: dict) -> bytes | None:
    return bytes.fromhex(header["parent"]) if header.get("parent") else None


def read_header(path: Path) -> tuple[dict, int]:
    """A file's header, checked (magic, CRC, layout, folder, size), and the file's size."""
    with open(path, "rb") as f:
        return _header(f, path)


def _header(f, path: Path) -> tuple[dict, int]:
    head = f.read(len(MAGIC) + _PREFIX.size)
    if len(head) < len(MAGIC) + _PREFIX.size or head[: len(MAGIC)] != MAGIC:
        raise BadEntry("not a snapshot file of this layout")
    n, crc = _PREFIX.unpack(head[len(MAGIC):])
    raw = f.read(n)
    if len(raw) != n or zlib.crc32(raw) != crc:
        raise BadEntry("its header is cut short or corrupt")
    header = json.loads(raw)
    if header.get("layout") != LAYOUT or header.get("folder") != path.parent.name:
        raise BadEntry("it was written for another model or version")
    size = os.fstat(f.fileno()).st_size
    total = len(head) + n + sum(a[3] for a in header["arrays"])
    if size != total:
        raise BadEntry(f"it is {size} bytes, its header says {total}")
    return header, size


def read_file(path: Path, key: bytes, payload: bool) -> tuple[dict, object, int]:
    """A file's header and (`payload`) its tree of arrays, each check passed, else `BadEntry`."""
    with open(path, "rb") as f:
        header, _ = _header(f, path)
        if header["key"] != key.hex():
            raise BadEntry("its key is not its name")
        if not payload:
            return header, None, 0
        arrays = header["arrays"]
        buf = bytearray(sum(a[3] for a in arrays))
        if f.readinto(buf) != len(buf):
            raise BadEntry("it is cut short")
    if zlib.crc32(buf) != header["crc"]:
        raise BadEntry("its data does not match its checksum")
    leaves = []
    for dtype, shape, offset, nbytes in arrays:
        if dtype not in _NUMPY:
            raise BadEntry(f"an unknown dtype: {dtype}")
        kind = np.dtype(_NUMPY[dtype])
        leaves.append(RawArray(np.frombuffer(buf, dtype=kind, count=nbytes // kind.itemsize, offset=offset).reshape(shape), dtype))
    return header, unflatten(header["skeleton"], leaves), len(buf)
