"""The one launcher used by `mtpstack up`, the bench and (by mirroring) the Nix units.

`validator.worker_argv(profile)` yields an argv whose argv[0] is a bare program
name; this module turns it into something exec-able from the current
interpreter's environment, and builds the environment a worker needs on Linux.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

#: Debian's OpenBLAS. mlx-cpu bundles the reference BLAS, about 40x slower for matmul.
OPENBLAS_PATHS = {
    "x86_64": Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"),
    "aarch64": Path("/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3"),
}

#: argv[0] as written by the validator -> the module that runs it with `python -m`.
PROGRAM_MODULES = {"mtpstack": "mtpstack", "mlx_lm.server": "mlx_lm.server"}


def resolve_command(argv: list[str]) -> list[str]:
    """Return the argv to exec for a `validator.worker_argv` result.

    The console script next to `sys.executable` is preferred (so /proc/PID/cmdline
    reads naturally); without it the program runs as `python -m MODULE`.
    """
    if not argv:
        raise ValueError("empty worker argv")
    program, rest = argv[0], list(argv[1:])
    if program not in PROGRAM_MODULES:
        return list(argv)
    script = Path(sys.executable).parent / program
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), *rest]
    return [sys.executable, "-m", PROGRAM_MODULES[program], *rest]


def openblas_path() -> Path | None:
    """Debian's OpenBLAS for this machine, if installed (Linux only)."""
    if platform.system() != "Linux":
        return None
    path = OPENBLAS_PATHS.get(platform.machine())
    return path if path is not None and path.exists() else None


def worker_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default `os.environ`) plus OpenBLAS preloaded on Linux and the hub offline."""
    env = dict(os.environ if base is None else base)
    blas = openblas_path()
    if blas is not None:
        preload = env.get("LD_PRELOAD", "")
        if str(blas) not in preload.split(":") and str(blas) not in preload.split():
            env["LD_PRELOAD"] = f"{blas}:{preload}" if preload else str(blas)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def which(program: str) -> str | None:
    """Where `program` would come from: next to the interpreter first, then PATH."""
    script = Path(sys.executable).parent / program
    if script.is_file():
        return str(script)
    return shutil.which(program)


def rank_environments(peers: list[str], backend: str, hostfile: Path, ibv_devices: list | None = None) -> list[dict[str, str]]:
    """What `mlx.launch` would add to each rank's environment, in rank order, for a worker whose
    ranks listen at `peers` (`ip:port`, rank order). For `ring`: the rank and the hostfile, written
    to `hostfile` (one `["ip:port"]` per rank). For `jaccl`: the rank, its coordinator (rank 0's
    `ip:port`) and the RDMA device file `MLX_IBV_DEVICES` (`ibv_devices`, the profile's
    `distributed.ibvDevices`, written to `hostfile`), from which JACCL takes the group's size.
    `modules/lib/distributed.nix` renders the same for the Nix units."""
    if backend == "ring":
        hostfile.write_text(json.dumps([[p] for p in peers]))
        return [{"MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)} for r in range(len(peers))]
    hostfile.write_text(json.dumps(ibv_devices))
    return [{"MLX_RANK": str(r), "MLX_IBV_DEVICES": str(hostfile), "MLX_JACCL_COORDINATOR": peers[0]} for r in range(len(peers))]
