import copy

import pytest

BASE = {
    "proxy": {"concurrencyLimit": 1, "modelConcurrencyLimits": {"qwen3.8-27b": 2}},
    "workers": {
        "qwen-mtp": {
            "model": "qwen3.8-27b",
            "target": {"path": "mlx-community/Qwen3.8-27B-4bit", "bits": 4},
            "drafter": {"path": "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX", "bits": 6, "depth": 3},
            "maxNumSeqs": 2,
            "port": 8101,
        }
    },
}


@pytest.fixture
def fleet():
    """A valid fleet as plain data; tests mutate their own copy."""
    return copy.deepcopy(BASE)
