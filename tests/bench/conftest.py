"""Fixtures for the bench tests: tiny real model pairs, a fleet config that serves them, and a
one-prompt-per-workload prompt set so a real sweep stays within seconds; and `run_bench`, a script run as users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtpstack.bench.sweep import SweepSettings


def run_bench(script: str, out: Path, *args: str, timeout: float = 1200,
              written: str | None = None) -> tuple[dict, subprocess.CompletedProcess]:
    """`bench/scripts/SCRIPT.py ARGS --out OUT` from the repo root: its JSON (OUT, or OUT/WRITTEN when `--out` is a
    folder), once it exited 0, and the run."""
    done = subprocess.run([sys.executable, f"bench/scripts/{script}.py", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / written if written else out).read_text()), done


@pytest.fixture(scope="session")
def other_pair(tmp_path_factory) -> tuple[Path, Path]:
    pytest.importorskip("mlx.core", reason="the real-sweep tests need mlx (Linux: pip install 'mlx[cpu]')")
    from devkit.demo.tiny import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("tiny-b"), seed=1)


def fleet_data(target: Path, drafter: Path, depth: int = 2) -> dict:
    return {
        "proxy": {"host": "127.0.0.1", "port": 18080, "concurrencyLimit": 1},
        "policy": {"allowedBackends": ["native"]},
        "workers": {
            "tiny": {
                "model": "tiny",
                "target": {"path": str(target), "bits": "fp32"},
                "drafter": {"path": str(drafter), "bits": "fp32", "depth": depth},
                "maxNumSeqs": 1,
                "port": 18101,
            }
        },
    }


@pytest.fixture
def fleet_file(tmp_path, tiny_pair) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet_data(*tiny_pair)))
    return path


@pytest.fixture
def one_prompt_each(tmp_path) -> Path:
    """Test-only prompt set: the first shipped prompt of each workload."""
    shipped = Path(__file__).resolve().parents[2] / "bench" / "prompts"
    out = tmp_path / "prompts"
    out.mkdir()
    for workload in ("code", "prose"):
        first = (shipped / f"{workload}.jsonl").read_text().splitlines()[0]
        json.loads(first)
        (out / f"{workload}.jsonl").write_text(first + "\n")
    return out


@pytest.fixture
def fast_settings(fleet_file, one_prompt_each, tmp_path) -> SweepSettings:
    return SweepSettings(
        config_file=str(fleet_file),
        worker="tiny",
        depths=[2],
        baseline="no-drafter",
        repeats=3,
        max_repeats=3,
        workloads=["code", "prose"],
        out=tmp_path / "out",
        max_tokens=8,
        prompts_dir=one_prompt_each,
        startup_timeout=120.0,
    )
