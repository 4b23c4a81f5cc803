"""Load an MTP head: a standalone folder, or the `mtp.*` tensors bundled in a target's original checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mtpstack.validator import BUNDLED_MTP_PREFIX, read_config, same_directory
from mtpstack.worker.mtp.qwen3_5 import Qwen35MTPHead

#: Standalone folder `model_type` -> head class.
HEADS = {"qwen3_5_mtp": Qwen35MTPHead}
#: Target family (`model_type`, or its `text_config.model_type`) -> head class for bundled `mtp.*` tensors.
BUNDLED = {"qwen3_5": Qwen35MTPHead, "qwen3_5_moe": Qwen35MTPHead, "qwen3_5_text": Qwen35MTPHead, "qwen3_next": Qwen35MTPHead}


class HeadLoadError(ValueError):
    """A head that cannot be loaded; the message names the file and the fix."""


@dataclass
class LoadedHead:
    module: nn.Module
    config: dict  # the head's own config.json, or the target's for a bundled head
    bundled: bool


def _text_config(config: dict) -> dict:
    text = config.get("text_config")
    return dict(text) if isinstance(text, dict) else dict(config)


def _read_tensors(directory: Path, *, only_prefix: str | None = None) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    for file in sorted(directory.glob("*.safetensors")):
        for key, value in mx.load(str(file)).items():
            if only_prefix is None or key.startswith(only_prefix):
                weights[key] = value
    return weights


def load_head(drafter: Path, target: Path) -> LoadedHead:
    """The head at `drafter` (a standalone folder, or `target` itself for a bundled head), weights loaded."""
    bundled = same_directory(drafter, target)
    config = read_config(drafter)
    if config is None:
        raise HeadLoadError(f"the MTP head has no readable `config.json`: `{drafter}`")
    if bundled:
        family = config.get("model_type")
        family = family if family in BUNDLED else _text_config(config).get("model_type")
        cls = BUNDLED.get(family)
        if cls is None:
            known = ", ".join(f"`{k}`" for k in BUNDLED)
            raise HeadLoadError(f"no MTP head is known for target type `{family}` (known: {known}): `{drafter}`")
        weights = _read_tensors(drafter, only_prefix=BUNDLED_MTP_PREFIX)
        if not weights:
            raise HeadLoadError(
                f"the target's checkpoint holds no `{BUNDLED_MTP_PREFIX}*` tensors (converted targets usually drop them): "
                f"`{drafter}`\n\nhint: point `drafter.path` at the standalone head folder"
            )
        original = True  # `mtp.*` tensors only survive in original-layout checkpoints
    else:
        cls = HEADS.get(config.get("model_type"))
        if cls is None:
            known = ", ".join(f"`{k}`" for k in HEADS)
            raise HeadLoadError(
                f"not an MTP head folder: model_type is `{config.get('model_type')}` (known: {known}): `{drafter}`"
            )
        weights = _read_tensors(drafter)
        original = any(k.startswith(BUNDLED_MTP_PREFIX) for k in weights)
    text = _text_config(config)
    module = cls.from_config(text)
    weights = module.sanitize(weights, original=original)
    quant = config.get("quantization") if not bundled else None
    if isinstance(quant, dict) and "bits" in quant:
        nn.quantize(
            module,
            group_size=quant.get("group_size", 64),
            bits=quant["bits"],
            mode=quant.get("mode", "affine"),
            class_predicate=lambda path, m: hasattr(m, "to_quantized") and f"{path}.scales" in weights,
        )
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise HeadLoadError(f"the MTP head's tensors do not fit its config ({e}): `{drafter}`") from None
    mx.eval(module.parameters())
    module.eval()
    return LoadedHead(module=module, config=config, bundled=bundled)
