"""Each `mtpstack worker` setting, declared once: its flag, type, default, choices, range, help, and
where a fleet config holds it.

Everything else follows from this table: `mtpstack.worker.cli` builds its argument parser and its
range checks from it, `worker_argv` renders a worker profile's flags from it (in its order), and
`WorkerConfig` has one field per row (tests/worker/test_settings.py). The Nix side cannot import
it: tests/nix checks the worker options (`modules/worker-options.nix`), their defaults and
`modules/lib/argv.nix`'s rendering against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

from pydantic.fields import FieldInfo

from mtpstack.validator.config import (
    DEPTH_AUTO,
    DEPTH_AUTO_MAX_DEFAULT,
    DEPTH_DEFAULT,
    DEPTH_MAX,
    DEPTH_MIN,
    PREFIX_CACHE_DISK_GIB_DEFAULT,
    PREFIX_CACHE_GIB_DEFAULT,
    PREFIX_CACHE_GIB_MAX,
    DistributedBackend,
    ShardStrategy,
    StrictModel,
    WorkerProfile,
    format_gib,
)
from mtpstack.validator.modeldir import DRAFTER_KINDS


def parse_depth(text: str) -> int | str:
    """`--draft-depth`'s argument: a number of tokens, or `auto` (any case)."""
    return DEPTH_AUTO if text.strip().lower() == DEPTH_AUTO else int(text)


# argparse names the type in its message: "invalid depth (a number or `auto`) value: 'x'".
parse_depth.__name__ = "depth (a number or `auto`)"


def format_depth_map(depths: dict[str, int | str]) -> str:
    """`{"prose": 2, "code": 4}` -> `code=4,prose=2`: one plain argument, sorted as Nix sorts attribute names;
    `mtpstack.validator.claim.parse_depth_map` reads it back."""
    return ",".join(f"{name}={depths[name]}" for name in sorted(depths))


@dataclass(frozen=True)
class Setting:
    """One `mtpstack worker` flag."""

    #: The parsed argument's name and `WorkerConfig`'s field.
    name: str
    flag: str
    help: str
    #: How the parser reads the argument (`str.upper` reads any case).
    type: Callable[[str], object] = str
    #: What the worker takes without the flag.
    default: object = None
    choices: tuple | None = None
    required: bool = False
    #: The range the worker accepts, checked before it loads anything (either end may be None);
    #: `hint` names the fix when a value is outside it.
    minimum: float | None = None
    maximum: float | None = None
    hint: str | None = None
    #: Where a worker profile holds it: the camelCase path under `workers.<name>` (as operators and
    #: the Nix options write it); None: a worker-only flag a fleet config never sets.
    config: str | None = None
    #: The profile's value as the command line carries it, or None to leave the flag out; by default
    #: the value at `config` (None when absent), formatted by `format`.
    value: Callable[[WorkerProfile], object] | None = None
    format: Callable[[object], str] = str

    @property
    def key(self) -> str:
        """The flag without its dashes, as a command line read back names it (`draft-depth`)."""
        return self.flag.removeprefix("--")

    @property
    def help_text(self) -> str:
        """The help line `mtpstack worker --help` prints: the help, then the default unless it says it."""
        if "default" in self.help or self.default in (None, ""):
            return self.help
        shown = format(self.default, "g") if isinstance(self.default, float) else self.default
        return f"{self.help} (default: {shown})"

    def out_of_range(self, value) -> str | None:
        """Why `value` is outside the accepted range (the message `mtpstack worker` prints), or None."""
        lo, hi = self.minimum, self.maximum
        if value is None or isinstance(value, str) or (lo is None and hi is None):
            return None
        # Written so that NaN fails: it compares false with every bound.
        if lo is not None and hi is not None:
            return None if lo <= value <= hi else f"`{self.flag}` must be between {lo:g} and {hi:g}: {value}"
        if lo is not None:
            return None if value >= lo else f"`{self.flag}` must be at least {lo:g}: {value}"
        return None if value <= hi else f"`{self.flag}` must be at most {hi:g}: {value}"

    def rendered(self, profile: WorkerProfile) -> str | None:
        """The flag's argument for a worker profile, or None when the command line leaves the flag out."""
        if self.config is None:
            return None
        value = self.value(profile) if self.value is not None else profile_value(profile, self.config)
        return None if value is None else self.format(value)


def profile_value(profile: WorkerProfile, path: str):
    """The value at a camelCase `path` of a profile (`prefixCache.maxGiB`); None when a section on the way is null."""
    value = profile
    for key in path.split("."):
        if value is None:
            return None
        fields = type(value).model_fields
        value = getattr(value, next(name for name, f in fields.items() if (f.alias or name) == key))
    return value


def profile_paths(cls: type[StrictModel] = WorkerProfile, prefix: str = "") -> dict[str, FieldInfo]:
    """Every field of a worker profile by its camelCase path (nested sections opened: `prefixCache.dir`),
    the paths the Nix options and the table's `config` name."""
    paths: dict[str, FieldInfo] = {}
    for name, f in cls.model_fields.items():
        path = prefix + (f.alias or name)
        nested = [t for t in get_args(f.annotation) or [f.annotation] if isinstance(t, type) and issubclass(t, StrictModel)]
        if nested:
            paths.update(profile_paths(nested[0], path + "."))
        else:
            paths[path] = f
    return paths


def _drafter(get: Callable) -> Callable[[WorkerProfile], object]:
    return lambda p: None if p.drafter is None else get(p.drafter)


#: In the order a worker's command line carries them (`worker_argv`, `modules/lib/argv.nix`).
WORKER_SETTINGS: tuple[Setting, ...] = (
    Setting("model", "--model", "target model: a local directory or a cached hub id", required=True, config="target.path"),
    Setting("target_bits", "--target-bits", "the target's quantization as configured (reported on /identity)",
            config="target.bits"),
    Setting("draft_model", "--draft-model", "drafter: a local directory or a cached hub id", config="drafter.path"),
    Setting("drafter_bits", "--drafter-bits", "the drafter's quantization as configured (reported on /identity)",
            config="drafter.bits"),
    Setting("draft_depth", "--draft-depth",
            f"tokens drafted per step, 0 to {DEPTH_MAX}; `auto`: each step as deep as the rows' live acceptance pays for, "
            "0 included", type=parse_depth, default=DEPTH_DEFAULT,
            minimum=0, maximum=DEPTH_MAX, config="drafter.depth", value=_drafter(lambda d: d.default_depth)),
    # Checked when parsed (`parse_depth_map`): each class's depth from DEPTH_MIN to DEPTH_MAX, or `auto`.
    Setting("draft_depth_map", "--draft-depth-map",
            f"depth per workload class ({DEPTH_MIN} to {DEPTH_MAX}, or `auto`), `code=4,prose=auto`; `--draft-depth` "
            "serves every other class", default="", config="drafter.depth",
            value=_drafter(lambda d: format_depth_map(d.class_depths) if d.class_depths else None)),
    # Carried only where some depth is `auto`: a fixed depth has nothing to bound.
    Setting("draft_max_depth", "--draft-max-depth", "the deepest an `auto` depth drafts; the head is loaded for it",
            type=int, default=DEPTH_AUTO_MAX_DEFAULT, minimum=DEPTH_MIN, maximum=DEPTH_MAX, config="drafter.maxDepth",
            value=_drafter(lambda d: d.max_depth if d.auto else None)),
    Setting("draft_kind", "--draft-kind",
            "mtp: an MTP head (a standalone qwen3_5_mtp folder, or --draft-model equal to --model for a head bundled in "
            "the target's checkpoint); model: a separate draft model; auto: detected (default)",
            choices=DRAFTER_KINDS, default="auto", config="drafter.kind"),
    Setting("max_num_seqs", "--max-num-seqs", "sequences decoded at once", type=int, default=1, minimum=1,
            config="maxNumSeqs"),
    Setting("max_context_tokens", "--max-context-tokens",
            "longest context (prompt plus output tokens) a request may use, capped at the model's own maximum; longer: "
            "400 context_length_exceeded (default: the model's own maximum)", type=int, minimum=1,
            hint="pass a positive token count, or leave the flag out for the model's own maximum", config="maxContextTokens"),
    Setting("prefix_cache_gib", "--prefix-cache-gib",
            "memory for prompt snapshots later requests resume from, in GiB; 0 turns the prefix cache off", type=float,
            default=PREFIX_CACHE_GIB_DEFAULT, minimum=0, maximum=PREFIX_CACHE_GIB_MAX,
            hint="pass a size in GiB, or 0 to turn the prefix cache off", config="prefixCache.maxGiB", format=format_gib),
    Setting("prefix_cache_dir", "--prefix-cache-dir",
            "directory of the prefix cache's disk tier, which keeps snapshots across restarts (default: none, no disk tier)",
            config="prefixCache.dir"),
    # Carried only with a directory: without one there is no disk tier to bound.
    Setting("prefix_cache_disk_gib", "--prefix-cache-disk-gib",
            "disk the prefix cache's disk tier may use in --prefix-cache-dir, in GiB; 0 turns the disk tier off",
            type=float, default=PREFIX_CACHE_DISK_GIB_DEFAULT, minimum=0, maximum=PREFIX_CACHE_GIB_MAX,
            hint="pass a size in GiB, or 0 to turn the disk tier off", config="prefixCache.diskGiB", format=format_gib,
            value=lambda p: p.prefix_cache.disk_gib if p.prefix_cache.dir is not None else None),
    Setting("served_model_name", "--served-model-name", "model name on the API (default: the model directory's name)",
            config="model"),
    Setting("host", "--host", "address to listen on", default="127.0.0.1", config="host"),
    Setting("port", "--port", "port to listen on", type=int, default=8000, config="port"),
    Setting("distributed_backend", "--distributed-backend",
            "run as one rank of a worker across hosts (rank and peers from MLX_RANK and MLX_HOSTFILE, as `mlx.launch` "
            "sets them); rank 0 serves HTTP", choices=get_args(DistributedBackend), config="distributed.backend"),
    Setting("distributed_strategy", "--distributed-strategy",
            "how the ranks split the target: `tensor` (every layer) or `pipeline` (runs of layers)",
            choices=get_args(ShardStrategy), default="tensor", config="distributed.strategy"),
    # The worker's own: a fleet config passes these in `extraArgs` if at all.
    Setting("admission_grace_seconds", "--admission-grace-seconds",
            "how long a request beyond --max-num-seqs waits for a slot before 429", type=float, default=1.0),
    Setting("stall_seconds", "--stall-seconds",
            "/health turns 503 when work is pending and no step finished for this long", type=float, default=30.0),
    Setting("default_max_tokens", "--default-max-tokens", "output tokens when a request sets no max_tokens", type=int,
            default=512),
    Setting("log_level", "--log-level", "any case: `debug` and `DEBUG` are one level", type=str.upper,
            choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO"),
)
#: The settings by name (`WorkerConfig`'s field names).
SETTINGS: dict[str, Setting] = {s.name: s for s in WORKER_SETTINGS}
