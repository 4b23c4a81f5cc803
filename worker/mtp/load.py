"""Load an MTP head: a standalone folder, or the head's tensors bundled in a target's original checkpoint.

Which family a folder or a target belongs to, where a bundled head's tensors sit, and which
families are served all come from the one table, `mtpstack.validator.families` (`FAMILIES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mtpstack.validator import BY_HEAD_TYPE, Family, bundled_prefix, family_for_target, language_config, read_config, same_directory, served_target_types
from mtpstack.worker.mtp.families import head_class
from mtpstack.worker.mtp.interface import MTPHead


class HeadLoadError(ValueError):
    """A head that cannot be loaded; the message names the file and the fix."""


@dataclass
class LoadedHead:
    module: MTPHead
    config: dict  # the head's own config.json, or the target's for a bundled head
    bundled: bool
    family: Family


def _read_tensors(directory: Path, *, only_prefix: str | None = None) -> tuple[dict[str, mx.array], bool]:
    """The tensors (those under `only_prefix`), and whether any came from a file not written by MLX
    (an original checkpoint, whose norms are stored zero-centred)."""
    weights: dict[str, mx.array] = {}
    original = False
    for file in sorted(directory.glob("*.safetensors")):
        tensors, metadata = mx.load(str(file), return_metadata=True)
        taken = {k: v for k, v in tensors.items() if only_prefix is None or k.startswith(only_prefix)}
        original |= bool(taken) and (metadata or {}).get("format") != "mlx"
        weights.update(taken)
    return weights, original


def _served(family: Family, where: Path) -> Family:
    if not family.served:
        raise HeadLoadError(
            f"`{family.head_type}` heads are not served: {family.why_not}: `{where}`"
            "\n\nhint: serve the target without a drafter, or with a separate draft model of attention layers only"
        )
    return family


def _family(drafter: Path, config: dict, bundled: bool) -> Family:
    if bundled:
        family = family_for_target(config.get("model_type"), language_config(config).get("model_type"))
        if family is None:
            known = ", ".join(f"`{t}`" for t in served_target_types())
            raise HeadLoadError(
                f"no MTP head is known for target type `{config.get('model_type')}` (known: {known}): `{drafter}`"
            )
        return _served(family, drafter)
    family = BY_HEAD_TYPE.get(config.get("model_type"))
    if family is None:
        known = ", ".join(f"`{k}`" for k in BY_HEAD_TYPE)
        raise HeadLoadError(
            f"not an MTP head folder: model_type is `{config.get('model_type')}` (known: {known}): `{drafter}`"
        )
    return _served(family, drafter)


def quantize(module: nn.Module, quantization: dict | None, weights: dict[str, mx.array], *, prefix: str = "") -> None:
    """Quantize the modules whose tensors come quantized, each with its own parameters.

    `quantization` is a `config.json` entry as mlx-lm and mlx-vlm write it: the defaults
    (`bits`, `group_size`, `mode`) and per-module overrides keyed by module path (an 8-bit
    router gate in a 4-bit model: `"layers.0.mlp.gate": {"bits": 8, "group_size": 64}`; False
    for a module left unquantized). A bundled head's overrides carry the checkpoint's prefix
    (`mtp.layers.0.mlp.gate`), removed here with `prefix`.
    """
    if not isinstance(quantization, dict) or not any(k.endswith(".scales") for k in weights):
        return
    defaults = {k: quantization[k] for k in ("bits", "group_size", "mode") if k in quantization}
    overrides = {k.removeprefix(prefix): v for k, v in quantization.items()
                 if k.startswith(prefix) and isinstance(v, (dict, bool)) and k not in defaults}

    def predicate(path: str, m: nn.Module):
        if not hasattr(m, "to_quantized") or f"{path}.scales" not in weights:
            return False
        own = overrides.get(path)
        return own if isinstance(own, dict) else True

    nn.quantize(module, group_size=defaults.get("group_size", 64), bits=defaults.get("bits", 4),
                mode=defaults.get("mode", "affine"), class_predicate=predicate)


def load_head(drafter: Path, target: Path) -> LoadedHead:
    """The head at `drafter` (a standalone folder, or `target` itself for a bundled head), weights loaded."""
    bundled = same_directory(drafter, target)
    config = read_config(drafter)
    if config is None:
        raise HeadLoadError(f"the MTP head has no readable `config.json`: `{drafter}`")
    family = _family(drafter, config, bundled)
    if bundled:
        prefix = bundled_prefix(config)
        weights, original = _read_tensors(drafter, only_prefix=prefix)
        if not weights:
            raise HeadLoadError(
                f"the target's checkpoint holds no `{prefix}*` tensors (converted targets usually drop them): "
                f"`{drafter}`\n\nhint: point `drafter.path` at the standalone head folder"
            )
    else:
        prefix = ""
        weights, original = _read_tensors(drafter)
    text = dict(language_config(config))
    module = head_class(family).from_config(text)
    try:
        weights = module.sanitize(weights, prefix=family.prefix_for(text), original=original)
    except ValueError as e:
        raise HeadLoadError(f"the MTP head's tensors cannot be read: {e}: `{drafter}`") from None
    quantize(module, config.get("quantization"), weights, prefix=prefix)
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise HeadLoadError(f"the MTP head's tensors do not fit its config ({e}): `{drafter}`") from None
    mx.eval(module.parameters())
    module.eval()
    return LoadedHead(module=module, config=config, bundled=bundled, family=family)
