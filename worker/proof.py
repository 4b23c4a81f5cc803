"""Proving which weights a worker process loaded: the one proof `mtpstack weights`,
`mtpstack status` and `mtpstack bench sweep` run (`prove_weights`).

The weight paths and draft depth are on a worker's command line on purpose: the
process's own argv (read from the kernel, not from anything it says about
itself) names them (`mtpstack.validator.claim.weights_from_argv` reads them).
A native worker also reports what it resolved and hashed at load on `GET /identity`;
the proof cross-checks the two, and, where the caller asks, the command line against
what it expected and the hashes against the files.

No mlx here: the bench and the CLI import this without loading a model.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import platform
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtpstack.errors import UserError
from mtpstack.validator import Mismatch, WeightsClaim, compare_identity, draft_kind_from_argv, weights_from_argv

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


# -- the proof -----------------------------------------------------------------------------


class ProofError(UserError):
    """What a worker loaded cannot be proven at all: no such process, not a worker, no `/identity`.
    The original failure, where there was one, is the `__cause__`."""


class IdentityUnavailable(ProofError):
    """`/identity` did not answer with a document. `status` is its HTTP status (0: no answer);
    `proof` is what the command line alone gave (None when the proof started from a URL)."""

    def __init__(self, message: str, hint: str | None = None, *, status: int = 0):
        super().__init__(message, hint)
        self.status = status
        self.proof: WeightsProof | None = None


@dataclass
class WeightsProof:
    """What a worker process serves by its own command line, what its `/identity` says (None for
    mlx_lm.server, which has none: `note` says so), and every disagreement found."""

    pid: int
    url: str | None
    argv: list[str]
    claim: WeightsClaim
    #: The drafter kind the command line asks for (`--draft-kind`), None without one.
    kind: str | None
    identity: dict | None
    mismatches: list[Mismatch]
    note: str | None = None

    @property
    def proved(self) -> bool:
        return not self.mismatches

    @property
    def resolved_kind(self) -> str | None:
        """The drafter's kind as the worker resolved it (`/identity`), else as its command line asks."""
        return ((self.identity or {}).get("drafter") or {}).get("kind") or self.kind


#: Compared between what a caller asked for and the command line (`prove_weights(asked=...)`).
ASKED_FIELDS = (("backend", "backend"), ("target", "target"), ("drafter", "drafter"), ("depth", "depth"),
                ("depth per class", "depth_map"), ("maxNumSeqs", "max_num_seqs"))
MLX_LM_NOTE = "mlx_lm.server has no /identity: these weights are proven from its command line alone"


def prove_weights(
    pid: int | None = None,
    url: str | None = None,
    *,
    asked: WeightsClaim | None = None,
    expected_sha256: dict[str, str | None] | None = None,
    rehash: bool = False,
    timeout: float = 5.0,
    fetch: Callable[[str], dict] | None = None,
) -> WeightsProof:
    """Prove what the worker process `pid` (or the one `url/identity` names) serves.

    Always: its own command line (/proc/PID/cmdline) is read and parsed, and for a native worker
    `/identity` is fetched (from `url`, else the address on the command line) and must agree with
    it on pid, argv, target and drafter paths, depth, depth per class, drafter kind and maxNumSeqs.
    Where the caller asks: the command line must name what `asked` claims (the bench's configuration),
    `/identity`'s hashes must be `expected_sha256[role]`, and with `rehash` the files on disk are
    resolved as the process saw them and hashed again (`sha256_now` joins `/identity`'s entry).

    Raises `ProofError` when there is nothing to compare (`IdentityUnavailable` for `/identity`).
    """
    fetch = fetch or (lambda u: fetch_identity(u, timeout=timeout))
    identity = None
    if pid is None:
        if url is None:
            raise ValueError("prove_weights needs a pid or a url")
        identity = _fetch(fetch, url, None)
        pid = identity.get("pid")
        try:
            pid = int(pid)
            argv = read_cmdline(pid)
        except (ProcessLookupError, TypeError, ValueError) as e:
            raise ProofError(f"the process `{url}/identity` names is not running on this machine: pid {pid}",
                             "run `mtpstack weights` on the worker's own host") from e
        try:
            claim = weights_from_argv(argv)
        except ValueError as e:
            raise ProofError(f"process `{pid}` named by `{url}/identity` is not a worker: `{' '.join(argv)}`") from e
    else:
        try:
            argv = read_cmdline(pid)
        except ProcessLookupError as e:
            raise ProofError(f"no process with id: `{pid}`") from e
        try:
            claim = weights_from_argv(argv)
        except ValueError as e:
            raise ProofError(f"process `{pid}` is not a worker: `{' '.join(argv)}`") from e
        url = url or claim.url
    kind = draft_kind_from_argv(argv) if claim.drafter is not None else None
    mismatches = [Mismatch(what, getattr(asked, attr), getattr(claim, attr), "command line")
                  for what, attr in ASKED_FIELDS if asked is not None and getattr(asked, attr) != getattr(claim, attr)]
    if claim.backend == "mlx-lm":
        return WeightsProof(pid, url, argv, claim, kind, None, mismatches, MLX_LM_NOTE)
    if identity is None:
        try:
            identity = _fetch(fetch, url, pid)
        except IdentityUnavailable as e:
            e.proof = WeightsProof(pid, url, argv, claim, kind, None, mismatches)
            raise
    if identity.get("pid") != pid:
        mismatches.append(Mismatch("pid", pid, identity.get("pid"), "/identity"))
    if identity.get("argv") != argv:
        mismatches.append(Mismatch("argv", argv, identity.get("argv"), "/identity"))
    mismatches += compare_identity(claim, identity, kind)
    for role in ("target", "drafter"):
        entry = identity.get(role)
        if not isinstance(entry, dict) or getattr(claim, role) is None:
            continue
        want = (expected_sha256 or {}).get(role)
        if want is not None and entry.get("sha256") != want:
            mismatches.append(Mismatch(f"{role} sha256", want, entry.get("sha256"), "/identity"))
        if rehash:
            mismatches += _rehash(role, getattr(claim, role), entry, pid)
    return WeightsProof(pid, url, argv, claim, kind, identity, mismatches)


def _rehash(role: str, path: str, entry: dict, pid: int) -> list[Mismatch]:
    """The files of `role` on disk against what the worker loaded; sets `entry["sha256_now"]`."""
    found = []
    resolved = resolve_as_seen(path, pid)
    if resolved != entry.get("resolved_path"):
        found.append(Mismatch(f"{role} resolved", resolved, entry.get("resolved_path"), "files"))
    try:
        now = hash_weights(Path(entry.get("resolved_path") or resolved))
    except OSError as e:
        found.append(Mismatch(f"{role} files", entry.get("resolved_path") or resolved, str(e), "files"))
    else:
        entry["sha256_now"] = now
        if now != entry.get("sha256"):
            found.append(Mismatch(f"{role} sha256", entry.get("sha256"), now, "files"))
    return found


def _fetch(fetch: Callable[[str], dict], url: str | None, pid: int | None) -> dict:
    """`/identity` as a dict, or `IdentityUnavailable` saying why not (with the HTTP status)."""
    who = f"process `{pid}`'s worker" if pid is not None else "the worker"
    if url is None:
        raise IdentityUnavailable(f"{who} names no `--port` to reach its /identity at")
    try:
        identity = fetch(url)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise IdentityUnavailable(f"no /identity at `{url}`: not a native mtpstack worker",
                                      "an `mlx_lm.server` worker is proven by its process id: `mtpstack weights PID`",
                                      status=e.code) from e
        raise IdentityUnavailable(f"the worker answered {e.code} on `{url}/identity`",
                                  "a worker answers 503 while it loads; retry in a moment" if e.code == 503 else None,
                                  status=e.code) from e
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        raise IdentityUnavailable(f"{who} does not answer on `{url}/identity`: {getattr(e, 'reason', e)}") from e
    if not isinstance(identity, dict):
        raise IdentityUnavailable(f"{who} answers no JSON object on `{url}/identity`", status=200)
    return identity


def fetch_identity(url: str, timeout: float = 5.0) -> dict:
    """GET url/identity as JSON. Raises `urllib.error.URLError`/`HTTPError`/`ValueError`."""
    with urllib.request.urlopen(url.rstrip("/") + "/identity", timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8"))


class ModelNotFound(Exception):
    """A model path that is neither a local directory nor a cached hub id."""


def resolve_model_path(path_or_id: str) -> Path:
    """A local directory as is; otherwise a hub id looked up in huggingface_hub's cache, offline."""
    path = Path(path_or_id).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFound(f"model path is not a directory: `{path_or_id}`")
        return path.resolve()
    looks_like_id = path_or_id.count("/") == 1 and not path_or_id.startswith((".", "/", "~"))
    if not looks_like_id:
        raise ModelNotFound(f"model directory does not exist: `{path_or_id}`")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path_or_id, local_files_only=True)).resolve()
    except Exception:
        raise ModelNotFound(f"model is neither a local directory nor in the Hugging Face cache: `{path_or_id}`") from None


def resolve_as_seen(path: str, pid: int) -> str:
    """Resolve `path` as the worker process `pid` saw it (relative to its working directory)."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        try:
            p = Path(os.readlink(f"/proc/{pid}/cwd")) / p
        except OSError:
            pass
    try:
        return str(resolve_model_path(str(p) if p.exists() else path))
    except ModelNotFound:
        return str(p)


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
