"""Proving which weights a worker process loaded.

The weight paths and draft depth are on a worker's command line on purpose: the
process's own argv (read from the kernel, not from anything it says about
itself) names them. A native worker also reports what it resolved and hashed at
load on `GET /identity`; `mtpstack weights` cross-checks the two.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

#: Read in chunks so hashing a multi-GB shard does not hold it in memory.
HASH_CHUNK = 1 << 20


def read_cmdline(pid: int) -> list[str]:
    """The argv of process `pid`: /proc/PID/cmdline on Linux, `ps -o args=` on macOS.

    Raises `ProcessLookupError` when no such process exists.
    """
    proc = Path(f"/proc/{pid}/cmdline")
    if platform.system() == "Linux":
        try:
            raw = proc.read_bytes()
        except FileNotFoundError:
            raise ProcessLookupError(pid) from None
        return [part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0") if part]
    out = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise ProcessLookupError(pid)
    # ps joins argv with spaces; paths with spaces are ambiguous there, which macOS offers no way around.
    return out.stdout.strip().split()


@dataclass(frozen=True)
class WeightsClaim:
    """What a worker's argv says it serves."""

    backend: str  # "native" or "mlx-lm"
    target: str
    drafter: str | None
    depth: int | None
    max_num_seqs: int | None
    host: str | None = None
    port: int | None = None
    served_model_name: str | None = None
    #: `--draft-depth-map`: the depth per workload class beside `depth` (the `default` class); empty without.
    depth_map: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str | None:
        if self.port is None:
            return None
        host = self.host or "127.0.0.1"
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


def parse_depth_map(text: str) -> dict[str, int]:
    """`code=4,prose=2` (`--draft-depth-map`, written by `mtpstack.validator.argv.format_depth_map`) -> `{"code": 4, "prose": 2}`.
    Raises `ValueError` on an entry that is not `CLASS=DEPTH`."""
    out: dict[str, int] = {}
    for entry in text.split(",") if text else []:
        name, sep, value = entry.partition("=")
        if not sep or not name or not value.isdigit():
            raise ValueError(f"not `CLASS=DEPTH`: {entry!r}")
        out[name] = int(value)
    return out


def _program_start(argv: list[str]) -> tuple[str, int] | None:
    """Find the backend and the index after the program name in a full process argv."""
    for i, arg in enumerate(argv):
        # Nix wraps console scripts as `.NAME-wrapped`.
        name = Path(arg).name.lstrip(".").removesuffix("-wrapped")
        if name in ("mlx_lm.server",) or (arg == "mlx_lm.server" and i > 0 and argv[i - 1] == "-m"):
            return "mlx-lm", i + 1
        if arg == "mlx_lm" and i + 1 < len(argv) and argv[i + 1] == "server":
            return "mlx-lm", i + 2
        if name in ("mtpstack", "__main__.py") or (arg == "mtpstack" and i > 0 and argv[i - 1] == "-m"):
            if i + 1 < len(argv) and argv[i + 1] == "worker":
                return "native", i + 2
    return None


def _flags(args: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            if "=" in arg:
                key, value = arg[2:].split("=", 1)
                flags[key] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                flags[arg[2:]] = args[i + 1]
                i += 1
            else:
                flags[arg[2:]] = ""
        i += 1
    return flags


def weights_from_argv(argv: list[str]) -> WeightsClaim:
    """Parse the weights a `mtpstack worker` or `mlx_lm.server` argv names.

    Accepts a full process argv (interpreter, `-m`, script paths included) or the
    bare argv from `validator.worker_argv`. Raises `ValueError` when the argv is
    neither program or names no model.
    """
    found = _program_start(argv)
    if found is None:
        raise ValueError(f"not a `mtpstack worker` or `mlx_lm.server` command line: {' '.join(argv)}")
    backend, start = found
    flags = _flags(argv[start:])
    if not flags.get("model"):
        raise ValueError(f"the command line names no `--model`: {' '.join(argv)}")

    def as_int(key: str) -> int | None:
        value = flags.get(key)
        return int(value) if value not in (None, "") else None

    drafter = flags.get("draft-model") or None
    if backend == "native":
        depth = as_int("draft-depth")
        if drafter is not None and depth is None:
            depth = 3  # the worker's default; keep in step with mtpstack.worker.cli
        max_num_seqs = as_int("max-num-seqs")
        served = flags.get("served-model-name")
        depth_map = parse_depth_map(flags.get("draft-depth-map") or "") if drafter is not None else {}
    else:
        depth = as_int("num-draft-tokens")
        if drafter is not None and depth is None:
            depth = 3  # mlx_lm.server's default --num-draft-tokens
        width = [w for w in (as_int("decode-concurrency"), as_int("prompt-concurrency")) if w is not None]
        # mlx_lm.server serves one request at a time once a draft model is set.
        max_num_seqs = 1 if drafter is not None else (max(width) if width else 32)
        served = None
        depth_map = {}
    return WeightsClaim(
        backend=backend,
        target=flags["model"],
        drafter=drafter,
        depth=depth if drafter is not None else None,
        max_num_seqs=max_num_seqs,
        host=flags.get("host") or "127.0.0.1",
        port=as_int("port") if backend == "native" else (as_int("port") or 8080),
        served_model_name=served,
        depth_map=depth_map,
    )


def identity_disagreements(claim: WeightsClaim, identity: dict, source: str, kind: str | None = None) -> list[str]:
    """How a worker's `/identity` disagrees with a claim about what it serves (read from an argv),
    one sentence per difference naming the claim's `source`; empty when they agree. `kind` is
    the drafter kind the claim asks for (`auto` accepts whatever the worker resolved)."""
    found: list[str] = []

    def differs(what: str, claimed, reported) -> None:
        if claimed != reported:
            found.append(f"{what}: {source} `{claimed}`, /identity `{reported}`")

    differs("target", claim.target, (identity.get("target") or {}).get("path"))
    differs("drafter", claim.drafter, (identity.get("drafter") or {}).get("path"))
    if claim.drafter is not None:
        differs("depth", claim.depth, identity.get("draft_depth"))
        if claim.depth_map or identity.get("draft_depth_map"):
            differs("depth per class", claim.depth_map, identity.get("draft_depth_map") or {})
        reported_kind = (identity.get("drafter") or {}).get("kind")
        if reported_kind is not None and kind not in (None, "auto", reported_kind):
            differs("drafter kind", kind, reported_kind)
    if claim.max_num_seqs is not None and "max_num_seqs" in identity:
        differs("maxNumSeqs", claim.max_num_seqs, identity["max_num_seqs"])
    return found


def fetch_identity(url: str, timeout: float = 5.0) -> dict:
    """GET url/identity as JSON. Raises `urllib.error.URLError`/`HTTPError`/`ValueError`."""
    with urllib.request.urlopen(url.rstrip("/") + "/identity", timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8"))


def weight_files(model_dir: Path) -> list[Path]:
    """The files whose content defines a model: sorted *.safetensors, then config.json."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    config = model_dir / "config.json"
    if config.exists():
        files.append(config)
    return files


def hash_weights(model_dir: Path) -> str:
    """sha256 over the contents of `weight_files(model_dir)`, each prefixed by its name.

    Names are included so that swapping two shards changes the hash.
    """
    digest = hashlib.sha256()
    files = weight_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no *.safetensors or config.json in {model_dir}")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(HASH_CHUNK):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()
