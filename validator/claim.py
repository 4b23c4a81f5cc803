"""What a worker's command line claims it serves, and how a worker's `/identity` compares with a claim.

The reverse of `mtpstack.validator.argv.worker_argv`: `weights_from_argv` reads a `mtpstack worker`
or `mlx_lm.server` argv (the one the config implies, or a running process's own) back into a
`WeightsClaim`. `compare_identity` is the one comparison of a claim with a worker's `/identity`,
used by the weights proof (`mtpstack.worker.proof.prove_weights`) and the proxy's fleet status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mtpstack.runtime import url_of
from mtpstack.validator.config import DEPTH_AUTO
from mtpstack.validator.settings import SETTINGS


@dataclass(frozen=True)
class WeightsClaim:
    """What a worker's argv says it serves."""

    backend: str  # "native" or "mlx-lm"
    target: str
    drafter: str | None
    #: A number of tokens or `auto`; None where the backend's own default applies.
    depth: int | str | None
    max_num_seqs: int | None
    host: str | None = None
    port: int | None = None
    served_model_name: str | None = None
    #: `--draft-depth-map`: the depth per workload class beside `depth` (the `default` class); empty without.
    depth_map: dict[str, int | str] = field(default_factory=dict)

    @property
    def url(self) -> str | None:
        if self.port is None:
            return None
        return url_of(self.host or "127.0.0.1", self.port)


def parse_depth_map(text: str) -> dict[str, int | str]:
    """`code=4,prose=auto` (`--draft-depth-map`, written by `mtpstack.validator.settings.format_depth_map`) -> `{"code": 4, "prose": "auto"}`.
    Raises `ValueError` on an entry that is not `CLASS=DEPTH`."""
    out: dict[str, int] = {}
    for entry in text.split(",") if text else []:
        name, sep, value = entry.partition("=")
        if not sep or not name or not (value.isdigit() or value == DEPTH_AUTO):
            raise ValueError(f"not `CLASS=DEPTH`: {entry!r}")
        out[name] = DEPTH_AUTO if value == DEPTH_AUTO else int(value)
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
        key = {name: s.key for name, s in SETTINGS.items()}
        depth = flags.get(key["draft_depth"]) or None
        depth = None if depth is None else (DEPTH_AUTO if depth.lower() == DEPTH_AUTO else int(depth))
        if drafter is not None and depth is None:
            depth = SETTINGS["draft_depth"].default  # what `mtpstack worker` takes without the flag
        max_num_seqs = as_int(key["max_num_seqs"])
        served = flags.get(key["served_model_name"])
        depth_map = parse_depth_map(flags.get(key["draft_depth_map"]) or "") if drafter is not None else {}
    else:
        # Without the flag mlx_lm.server takes its own default, which is its to own: the claim says None.
        depth = as_int("num-draft-tokens")
        width = [w for w in (as_int("decode-concurrency"), as_int("prompt-concurrency")) if w is not None]
        # mlx_lm.server serves one request at a time once a draft model is set.
        max_num_seqs = 1 if drafter is not None else (max(width) if width else None)
        served = None
        depth_map = {}
    return WeightsClaim(
        backend=backend,
        target=flags["model"],
        drafter=drafter,
        depth=depth if drafter is not None else None,
        max_num_seqs=max_num_seqs,
        host=flags.get("host") or "127.0.0.1",
        port=as_int("port"),
        served_model_name=served,
        depth_map=depth_map,
    )


@dataclass(frozen=True)
class Mismatch:
    """One way a worker disagrees with what it should serve. `what` names the item (`target`,
    `drafter`, `depth`, `depth per class`, `drafter kind`, `maxNumSeqs`, `backend`, `pid`, `argv`,
    or ROLE + ` resolved` / ` sha256` / ` files`); `want` is the reference value (the command line's,
    or what the caller asked for), `got` the one found `at` (`/identity`, `command line`, `files`)."""

    what: str
    want: object
    got: object
    at: str


def compare_identity(claim: WeightsClaim, identity: dict, kind: str | None = None, *, depths: bool = True) -> list[Mismatch]:
    """How a worker's `/identity` disagrees with a claim about what it serves (read from an argv).
    `kind` is the drafter kind the claim asks for (`auto` accepts whatever the worker resolved);
    a kind or maxNumSeqs the worker does not report is not held against it. `depths=False` leaves
    the draft depths out (tuning the claim's source may not know current: the proxy's config)."""
    found: list[Mismatch] = []

    def differs(what: str, want, got) -> None:
        if want != got:
            found.append(Mismatch(what, want, got, "/identity"))

    differs("target", claim.target, (identity.get("target") or {}).get("path"))
    differs("drafter", claim.drafter, (identity.get("drafter") or {}).get("path"))
    if claim.drafter is not None and depths:
        differs("depth", claim.depth, identity.get("draft_depth"))
        differs("depth per class", claim.depth_map, identity.get("draft_depth_map") or {})
    if claim.drafter is not None:
        reported_kind = (identity.get("drafter") or {}).get("kind")
        if reported_kind is not None and kind not in (None, "auto", reported_kind):
            differs("drafter kind", kind, reported_kind)
    if claim.max_num_seqs is not None and "max_num_seqs" in identity:
        differs("maxNumSeqs", claim.max_num_seqs, identity["max_num_seqs"])
    return found


def identity_disagreements(claim: WeightsClaim, identity: dict, source: str, kind: str | None = None, *, depths: bool = True) -> list[str]:
    """`compare_identity` as sentences naming the claim's `source`; empty when they agree."""
    return [f"{m.what}: {source} `{m.want}`, /identity `{m.got}`" for m in compare_identity(claim, identity, kind, depths=depths)]
