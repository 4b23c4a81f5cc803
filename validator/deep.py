"""`--deep` checks: compare what the config claims with the model directories on disk."""

from __future__ import annotations

import json
from pathlib import Path

from validator.config import FleetConfig
from validator.findings import Finding

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def local_dir(path: str, base: Path) -> Path | None:
    """The local model directory `path` names (as given, or relative to the config's folder), if any."""
    for candidate in (Path(path).expanduser(), base / path):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def recorded_bits(model_config: dict) -> str | None:
    """The precision a model's `config.json` records, spelled as in the fleet config."""
    quant = model_config.get("quantization") or model_config.get("quantization_config")
    if isinstance(quant, dict):
        if quant.get("mode") in {"mxfp4"}:
            return "mxfp4"
        if "bits" in quant:
            return str(quant["bits"])
    dtype = model_config.get("torch_dtype") or model_config.get("dtype")
    return _DTYPES.get(str(dtype)) if dtype else None


def _read_config(directory: Path) -> dict | None:
    try:
        return json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None


def check_deep(config: FleetConfig, base: Path) -> list[Finding]:
    findings: list[Finding] = []
    for name, worker in config.workers.items():
        parts = [("target", worker.target.path, worker.target.bits)]
        if worker.drafter is not None:
            parts.append(("drafter", worker.drafter.path, worker.drafter.bits))
        vocab: dict[str, int] = {}
        for role, path, bits in parts:
            directory = local_dir(path, base)
            if directory is None:
                continue  # a hub id: nothing on disk to compare
            model_config = _read_config(directory)
            if model_config is None:
                findings.append(
                    Finding(
                        code="model-config-missing",
                        severity="error",
                        path=("workers", name, role, "path"),
                        message=f"`{directory}` has no readable `config.json`",
                        hint="point the path at a model directory (the one holding config.json and *.safetensors)",
                    )
                )
                continue
            if isinstance(model_config.get("vocab_size"), int):
                vocab[role] = model_config["vocab_size"]
            recorded = recorded_bits(model_config)
            if recorded is not None and recorded != str(bits):
                findings.append(
                    Finding(
                        code="bits-mismatch",
                        severity="error",
                        path=("workers", name, role, "bits"),
                        message=f"the config says {bits} but `{directory}/config.json` records {recorded}",
                        hint=f"set `bits` to {recorded}, or point `path` at the {bits} variant",
                    )
                )
        if len(vocab) == 2 and vocab["target"] != vocab["drafter"]:
            findings.append(
                Finding(
                    code="vocab-mismatch",
                    severity="error",
                    path=("workers", name, "drafter", "path"),
                    message=(
                        f"the drafter's vocabulary has {vocab['drafter']} tokens but the target's has "
                        f"{vocab['target']}; its drafts could never be accepted"
                    ),
                    hint="use the drafter that was trained with this target",
                    related=(("workers", name, "target", "path"),),
                )
            )
    return findings
