from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    from devkit.demo.tiny import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def tiny_hybrid_pair(tmp_path_factory) -> tuple[Path, Path]:
    from devkit.demo.tiny_hybrid import build_tiny_hybrid_pair

    return build_tiny_hybrid_pair(tmp_path_factory.mktemp("tiny-hybrid"), seed=0)
