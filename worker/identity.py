"""What a running worker says it is (`/identity`): the models it loaded, its settings, the device
and BLAS it computes with, its process and versions. `mtpstack weights` and `mtpstack status` compare it."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.proof import read_cmdline

#: When this process started (its `started_at`, and the `created` of the model `/v1/models` lists).
STARTED_AT = time.time()


def blas_in_use() -> str:
    """Which BLAS mlx runs matmuls with, as far as can be seen from inside the process.

    On Linux an OpenBLAS named in LD_PRELOAD and mapped into the process wins;
    numpy's own vendored OpenBLAS does not count, mlx never calls it.
    """
    if platform.system() == "Darwin":
        return "accelerate"
    try:
        mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/" in line}
    except OSError:
        return "unknown"
    for lib in os.environ.get("LD_PRELOAD", "").replace(" ", ":").split(":"):
        if lib and "blas" in lib.lower():
            real = os.path.realpath(lib)
            if lib in mapped or real in mapped:
                return real if real != lib else lib
    return "bundled (reference BLAS, slow)"


def build_identity(config: WorkerConfig, engine, prefix_cache=None) -> dict:
    import mlx.core as mx
    import mlx_lm

    from mtpstack import __version__

    device = mx.default_device()
    return {
        "served_model_name": config.served_model_name,
        "backend": "native",
        "target": engine.target.identity(),
        "drafter": engine.drafter.identity() if engine.drafter is not None else None,
        "draft_depth": config.draft_depth if engine.drafter is not None else None,
        "draft_depth_map": dict(sorted(config.draft_depth_map.items())) if engine.drafter is not None else None,
        "max_num_seqs": config.max_num_seqs,
        # Every served target verifies a batch with per-row rollback (the field stays for readers of it).
        "batched_verification": True,
        "context_length": engine.context_length,
        "max_context_tokens": config.max_context_tokens,
        # The disk tier's directory (None: no disk tier) and both budgets, as configured.
        "prefix_cache": {
            "max_gib": config.prefix_cache_gib,
            "max_bytes": config.prefix_cache_bytes,
            "dir": config.prefix_cache_dir,
            "disk_gib": config.prefix_cache_disk_gib,
            "disk_max_bytes": config.prefix_cache_disk_bytes,
            # What the cache holds outlives the process while this stays the same (the disk tier's
            # own id, kept in its directory); None: it does not (no disk tier, or it is off).
            "id": disk.cache_id if (disk := getattr(prefix_cache, "disk", None)) is not None else None,
        },
        "device": "gpu" if device.type == mx.gpu else "cpu",
        "blas": blas_in_use(),
        "pid": os.getpid(),
        "started_at": STARTED_AT,
        "argv": _own_argv(),
        "versions": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "mtpstack": __version__},
    }


def _own_argv() -> list[str]:
    # The same source `mtpstack weights` reads, so the two compare exactly.
    try:
        return read_cmdline(os.getpid())
    except (ProcessLookupError, OSError):
        return list(sys.argv)

