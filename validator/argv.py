"""A worker profile -> the worker's command line.

The weight paths and the draft depth are on the command line on purpose: the
running process's own argv (`/proc/PID/cmdline`) then proves what it loaded.
`mtpstack up`, the bench and the Nix module all produce this same argv; the Nix
twin is `modules/lib/argv.nix`, tested against this function.

argv[0] is the bare program name (`mtpstack` or `mlx_lm.server`); callers
that exec it resolve that name to a path.
"""

from __future__ import annotations

from mtpstack.validator.config import WorkerProfile
from mtpstack.validator.settings import SETTINGS, WORKER_SETTINGS

NATIVE_PROGRAM = "mtpstack"
MLX_LM_PROGRAM = "mlx_lm.server"


def worker_argv(profile: WorkerProfile) -> list[str]:
    """The native worker's flags come from the settings table, in its order; a setting a profile
    leaves unset (no drafter, no context cap, not distributed) is left out. A distributed worker's
    rank and peers come in the environment `mlx.launch` would set (`MLX_RANK`, `MLX_HOSTFILE`), so
    every rank runs this same argv."""
    if profile.backend == "mlx-lm":
        return _mlx_lm_argv(profile)
    argv = [NATIVE_PROGRAM, "worker"]
    for setting in WORKER_SETTINGS:
        value = setting.rendered(profile)
        if value is not None:
            argv += [setting.flag, value]
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
    flag, kind = SETTINGS["draft_kind"].flag, None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            kind = argv[i + 1]
        elif arg.startswith(flag + "="):
            kind = arg.split("=", 1)[1]
    return kind
