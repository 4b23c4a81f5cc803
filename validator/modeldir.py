"""What a model directory says about itself: the one reader of `config.json` and safetensors headers.

The worker (context length, drafter kind, vocabulary check), `validate --deep`
and the bench all read model directories through this module. Multimodal
families (Qwen3.5 and its MTP heads among them) keep the language model's
settings inside `text_config`; every lookup here falls back to it, so a check
never silently skips such a model because a key is not at the top level.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mtpstack.validator.families import BUNDLED_MTP_PREFIX, BY_HEAD_TYPE, Family, family_for_target, recurrent_target_types

DrafterKind = Literal["mtp", "model"]
#: `drafter.kind` values in the config; `auto` is resolved by `detect_drafter_kind`.
DRAFTER_KINDS = ("auto", "mtp", "model")
#: Target types whose layers keep recurrent state (gated-delta, Mamba2) between attention layers:
#: served as targets with per-row rollback, never as a separate draft model (whose rejected
#: drafts are rolled back by length). The worker refuses such a draft model at load; `--deep` before that.
RECURRENT_TARGET_TYPES = recurrent_target_types()
#: A safetensors header larger than this is not a header (the format caps it at 100 MB).
_MAX_HEADER = 100_000_000


def read_config(directory: Path) -> dict | None:
    """`config.json` of `directory` as a dict, or None when it is missing or not a JSON object."""
    try:
        data = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def language_config(config: dict) -> dict:
    """The language model's settings: the nested `text_config` of a multimodal config, else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def config_value(config: dict, key: str):
    """`key` from the top level of a model config, else from its `text_config`."""
    return config[key] if key in config else language_config(config).get(key)


_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def recorded_bits(model_config: dict) -> str | None:
    """The precision a model's `config.json` records, spelled as in the fleet config (`4`, `mxfp4`, `bf16`)."""
    quant = config_value(model_config, "quantization") or config_value(model_config, "quantization_config")
    if isinstance(quant, dict):
        if quant.get("mode") in {"mxfp4"}:
            return "mxfp4"
        if "bits" in quant:
            return str(quant["bits"])
    dtype = config_value(model_config, "torch_dtype") or config_value(model_config, "dtype")
    return _DTYPES.get(str(dtype)) if dtype else None


def bits_disagreement(claim, model_config: dict) -> str | None:
    """What `config.json` records when it contradicts a bits claim (`6`, `bf16`, ...), else None (also when
    there is no claim or nothing recorded). The one comparison: `validate --deep` and the worker's
    `/identity` (`bits_mismatch`) both make it here."""
    recorded = recorded_bits(model_config)
    return recorded if claim is not None and recorded is not None and recorded != str(claim) else None


def tensor_names(directory: Path) -> list[str]:
    """Names of every tensor in the directory's `*.safetensors` files, read from their headers only."""
    names: list[str] = []
    for file in sorted(Path(directory).glob("*.safetensors")):
        try:
            with file.open("rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                if size > _MAX_HEADER:
                    continue
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            continue
        if isinstance(header, dict):
            names += [k for k in header if k != "__metadata__"]
    return names


@dataclass(frozen=True)
class ModelFacts:
    """The facts about one model directory that the stack checks against each other."""

    model_type: str | None
    text_model_type: str | None  # `text_config.model_type`, the family a head belongs to
    vocab_size: int | None
    hidden_size: int | None
    context_length: int | None
    has_bundled_mtp: bool  # the head's tensors (`mtp.*` for most families) in the directory's own safetensors
    full_attention_interval: int | None = None

    @property
    def is_mtp_head(self) -> bool:
        return self.model_type in BY_HEAD_TYPE

    @property
    def head_family(self) -> Family | None:
        """The MTP family of a head folder, or of the head a target's checkpoint may bundle."""
        if self.is_mtp_head:
            return BY_HEAD_TYPE[self.model_type]
        return family_for_target(self.model_type, self.text_model_type)

    @property
    def recurrent(self) -> bool:
        """A model with gated-delta layers (every layer full attention, `full_attention_interval` 1, has none)."""
        return not self.is_mtp_head and self.model_type in RECURRENT_TARGET_TYPES and self.full_attention_interval != 1

    @property
    def family(self) -> str | None:
        """The architecture family: a head's is the target family it was made for."""
        if self.is_mtp_head:
            return self.text_model_type or self.model_type
        return self.model_type


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_facts(directory: Path, config: dict | None = None) -> ModelFacts | None:
    """The facts of `directory`, or None when it has no readable `config.json`."""
    config = read_config(directory) if config is None else config
    if config is None:
        return None
    text = language_config(config)
    return ModelFacts(
        model_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        text_model_type=text.get("model_type") if text is not config and isinstance(text.get("model_type"), str) else None,
        vocab_size=_int(config_value(config, "vocab_size")),
        hidden_size=_int(config_value(config, "hidden_size")),
        context_length=_int(config_value(config, "max_position_embeddings")),
        has_bundled_mtp=any(n.startswith(bundled_prefix(config)) for n in tensor_names(directory)),
        full_attention_interval=_int(config_value(config, "full_attention_interval")),
    )


def bundled_prefix(config: dict) -> str:
    """Where a head bundled in this target's checkpoint keeps its tensors (`mtp.` unless its family says otherwise)."""
    text = language_config(config)
    family = family_for_target(config.get("model_type"), text.get("model_type"))
    return family.prefix_for(text) if family is not None else BUNDLED_MTP_PREFIX


_PER_EXPERT = re.compile(r"\.experts\.\d+\.")


def head_layout(directory: Path, config: dict, *, bundled: bool) -> str:
    """How a head's files are laid out, in words: where its tensors are, its MoE form, its quantization.

    `config` is the head folder's own, or the target's for a bundled head. What `validate --deep`
    reports and what the worker's loader handles (`mtpstack.worker.mtp.load`)."""
    prefix = bundled_prefix(config) if bundled else ""
    names = [n for n in tensor_names(directory) if n.startswith(prefix)]
    where = f"bundled in the target's checkpoint as `{prefix}*`" if bundled else "a standalone head folder"
    if any(_PER_EXPERT.search(n) for n in names):
        mlp = "per-expert MoE tensors"
    elif any(".experts.gate_up_proj" in n for n in names):
        mlp = "fused `gate_up_proj` MoE experts"
    elif any(".switch_mlp." in n for n in names):
        mlp = "stacked MoE experts"
    else:
        mlp = "a dense MLP"
    quant = config.get("quantization") if any(n.endswith(".scales") for n in names) else None
    if isinstance(quant, dict) and "bits" in quant:
        own = [k for k, v in quant.items() if isinstance(v, dict) and k.startswith(prefix)]
        precision = f"{quant['bits']}-bit" + (f" with {len(own)} per-module override{'s' * (len(own) != 1)}" if own else "")
    elif isinstance(quant, dict):
        precision = "quantized"
    else:
        precision = "unquantized"
    return f"{where}, {mlp}, {precision}"


def same_directory(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def detect_drafter_kind(drafter: Path, target: Path | None) -> DrafterKind:
    """`mtp` for a standalone head folder or a head bundled in the target's own checkpoint, else `model`.

    `target` None (a hub id, nothing on disk) rules out only the bundled case."""
    facts = model_facts(drafter)
    if facts is not None and facts.is_mtp_head:
        return "mtp"
    if target is not None and same_directory(drafter, target) and facts is not None and facts.has_bundled_mtp:
        return "mtp"
    return "model"


def _family_name(model_type: str | None) -> str | None:
    # A multimodal checkpoint may name its language model `<family>_text` in `text_config`.
    return model_type.removesuffix("_text") if model_type else None


def head_mismatch(head: ModelFacts, target: ModelFacts) -> str | None:
    """Why an MTP head cannot draft for `target` (family, hidden size, vocabulary), or None."""
    family = BY_HEAD_TYPE.get(head.model_type or "")
    families = tuple(family.targets) if family is not None else ()
    if head.is_mtp_head and target.model_type not in families:
        return f"the head drafts for {', '.join(families)} models but the target is `{target.model_type}`"
    made_for = _family_name(head.text_model_type) if head.is_mtp_head else None
    target_families = {_family_name(target.model_type), _family_name(target.text_model_type)} - {None}
    if made_for is not None and made_for not in target_families:
        return f"the head was made for `{head.text_model_type}` models but the target is `{target.model_type}`"
    if head.hidden_size is not None and target.hidden_size is not None and head.hidden_size != target.hidden_size:
        return f"the head's hidden size is {head.hidden_size} but the target's is {target.hidden_size}"
    if head.vocab_size is not None and target.vocab_size is not None and head.vocab_size != target.vocab_size:
        return f"the head's vocabulary has {head.vocab_size} tokens but the target's has {target.vocab_size}"
    return None
