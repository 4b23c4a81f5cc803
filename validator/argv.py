"""A worker profile -> the worker's command line.

The weight paths and the draft depth are on the command line on purpose: the
running process's own argv (`/proc/PID/cmdline`) then proves what it loaded.
`mtpstack up`, the bench and the Nix module all produce this same argv; the Nix
twin is `modules/lib/argv.nix`, tested against this function.

argv[0] is the bare program name (`mtpstack` or `mlx_lm.server`); callers
that exec it resolve that name to a path.
"""

from __future__ import annotations

from mtpstack.validator.config import WorkerProfile, format_gib

NATIVE_PROGRAM = "mtpstack"
MLX_LM_PROGRAM = "mlx_lm.server"
#: The native worker's flag for `drafter.kind` (mlx_lm.server has none: it loads draft models only).
DRAFT_KIND_FLAG = "--draft-kind"
#: The native worker's flag for the depth per workload class: `code=4,prose=2`, sorted by class;
#: `--draft-depth` carries the `default` class.
DEPTH_MAP_FLAG = "--draft-depth-map"
#: The native worker's prefix cache budget in GiB (`prefixCache.maxGiB`; 0: off).
PREFIX_CACHE_FLAG = "--prefix-cache-gib"
#: A distributed worker's backend and strategy; its rank and peers come in the environment
#: `mlx.launch` would set (`MLX_RANK`, `MLX_HOSTFILE`), so every rank runs this same argv.
DISTRIBUTED_BACKEND_FLAG = "--distributed-backend"
DISTRIBUTED_STRATEGY_FLAG = "--distributed-strategy"


def format_depth_map(depths: dict[str, int]) -> str:
    """`{"prose": 2, "code": 4}` -> `code=4,prose=2`: one plain argument, sorted as Nix sorts attribute names;
    `mtpstack.validator.claim.parse_depth_map` reads it back."""
    return ",".join(f"{name}={depths[name]}" for name in sorted(depths))



def worker_argv(profile: WorkerProfile) -> list[str]:
    if profile.backend == "mlx-lm":
        return _mlx_lm_argv(profile)
    argv = [NATIVE_PROGRAM, "worker", "--model", profile.target.path, "--target-bits", str(profile.target.bits)]
    if profile.drafter is not None:
        argv += [
            "--draft-model", profile.drafter.path,
            "--drafter-bits", str(profile.drafter.bits),
            "--draft-depth", str(profile.drafter.default_depth),
        ]
        if profile.drafter.class_depths:
            argv += [DEPTH_MAP_FLAG, format_depth_map(profile.drafter.class_depths)]
        argv += [DRAFT_KIND_FLAG, profile.drafter.kind]
    argv += ["--max-num-seqs", str(profile.max_num_seqs)]
    if profile.max_context_tokens is not None:
        argv += ["--max-context-tokens", str(profile.max_context_tokens)]
    argv += [
        PREFIX_CACHE_FLAG, format_gib(profile.prefix_cache.max_gib),
        "--served-model-name", profile.model,
        "--host", profile.host,
        "--port", str(profile.port),
    ]
    if profile.distributed is not None:
        argv += [
            DISTRIBUTED_BACKEND_FLAG, profile.distributed.backend,
            DISTRIBUTED_STRATEGY_FLAG, profile.distributed.strategy,
        ]
    return argv + list(profile.extra_args)


def _mlx_lm_argv(profile: WorkerProfile) -> list[str]:
    # mlx_lm.server's effective decode width is the max of its two concurrency
    # flags, so both are set to the batch width. It has no context cap: the
    # rule `mlx-lm-cannot-cap-context` refuses `maxContextTokens` with it.
    argv = [MLX_LM_PROGRAM, "--model", profile.target.path]
    if profile.drafter is not None:
        argv += [
            "--draft-model", profile.drafter.path,
            # A depth map is refused with this backend (`mlx-lm-depth-map`); its default stands in.
            "--num-draft-tokens", str(profile.drafter.default_depth),
        ]
    gib = profile.prefix_cache.max_gib
    if profile.drafter is not None or gib == 0:
        # With a draft model its prompt cache returns wrong text after a hit.
        argv += ["--prompt-cache-size", "0"]
    else:
        argv += ["--prompt-cache-bytes", str(int(gib * 2**30))]
    argv += [
        "--decode-concurrency", str(profile.max_num_seqs),
        "--prompt-concurrency", str(profile.max_num_seqs),
        "--host", profile.host,
        "--port", str(profile.port),
    ]
    return argv + list(profile.extra_args)


def draft_kind_from_argv(argv: list[str]) -> str | None:
    """The `--draft-kind` value on a worker's command line (`--draft-kind K` or `--draft-kind=K`), if any;
    the last one counts, as for the worker's own argument parser."""
    kind = None
    for i, arg in enumerate(argv):
        if arg == DRAFT_KIND_FLAG and i + 1 < len(argv):
            kind = argv[i + 1]
        elif arg.startswith(DRAFT_KIND_FLAG + "="):
            kind = arg.split("=", 1)[1]
    return kind
