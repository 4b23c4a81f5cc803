"""What the installed mlx can run, for tests whose subject needs more than the oldest pinned mlx has."""

from __future__ import annotations

import mlx.core as mx

#: mlx-lm 0.32.2's quantized MoE layers pass `global_scale` to `mx.gather_qmm`, which mlx 0.31.2 (the
#: Nix package's pin on Linux) does not take: a quantized MoE model cannot run there, in mlx-lm itself
#: (plain decoding fails the same way), so the worker cannot serve one either.
QUANTIZED_MOE_RUNS = "global_scale" in (mx.gather_qmm.__doc__ or "")
QUANTIZED_MOE_REASON = f"mlx {mx.__version__}'s gather_qmm takes no `global_scale`, which mlx-lm's quantized MoE layers pass"
