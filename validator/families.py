"""MTP head families: the one table of what each head drafts for, where it lives and what its targets keep.

Detection (`modeldir`: is a folder a head, may it draft for that target, is a model recurrent),
loading (`mtpstack.worker.mtp.load`), `validate --deep` (which family and layout it found) and
the docs all read this table; nothing else names a head type, a bundled prefix or a cache kind.
A new family is one module in `worker/mtp/` (a class `Head`) and one `Family` here; the layout
test checks that every served family's module exists and every unserved one says why.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The kinds of layer state a target keeps between steps, as the engine rolls each back:
#: `kv` attention keys and values (by length), `gated-delta` the conv and recurrent state of
#: Qwen3.5 / Qwen3-Next linear attention, `mamba2` the conv and SSM state of Nemotron-H's mixers
#: (both kept after every verified position, the accepted one picked).
CACHE_KINDS = ("kv", "gated-delta", "mamba2")
#: Where most families' checkpoints keep a bundled head's tensors (and where detection looks for the
#: head of a target whose family the table does not know).
BUNDLED_MTP_PREFIX = "mtp."


@dataclass(frozen=True)
class Family:
    """One MTP head family, as mlx-vlm's splitters write its standalone folders."""

    head_type: str  # `model_type` of a standalone head folder
    #: Target `model_type` (top level, or `text_config.model_type`) -> the state kinds its layers keep.
    targets: dict[str, tuple[str, ...]]
    module: str  # `mtpstack.worker.mtp.<module>`, defining the head class `Head` and the target's hooks `TARGET`
    #: Where the head's tensors sit in an original checkpoint; `{num_hidden_layers}` is the target's.
    bundled_prefix: str = BUNDLED_MTP_PREFIX
    served: bool = True
    why_not: str = ""  # for a family the worker does not serve yet: the reason, for errors and docs

    def prefix_for(self, text_config: dict) -> str:
        """The bundled tensors' prefix in a checkpoint with this text config."""
        layers = text_config.get("num_hidden_layers")
        return self.bundled_prefix.format(num_hidden_layers=layers if isinstance(layers, int) else "?")


_QWEN_HYBRID = ("gated-delta", "kv")

FAMILIES: tuple[Family, ...] = (
    Family(
        head_type="qwen3_5_mtp",
        # Qwen3.5/3.6/3.8, dense and MoE; mlx-vlm's qwen3_next splitter writes this type too.
        targets={"qwen3_5": _QWEN_HYBRID, "qwen3_5_moe": _QWEN_HYBRID, "qwen3_5_text": _QWEN_HYBRID,
                 "qwen3_5_moe_text": _QWEN_HYBRID, "qwen3_next": _QWEN_HYBRID},
        module="qwen3_5",
    ),
    Family(
        head_type="nemotron_h_mtp",
        targets={"nemotron_h": ("mamba2", "kv")},
        module="nemotron_h",
    ),
    Family(
        head_type="glm4_moe_lite_mtp",
        targets={"glm4_moe_lite": ("kv",)},
        module="glm4_moe_lite",
        bundled_prefix="model.layers.{num_hidden_layers}.",
    ),
)

#: Standalone head `model_type` -> its family.
BY_HEAD_TYPE: dict[str, Family] = {f.head_type: f for f in FAMILIES}


def family_for_target(*model_types: str | None) -> Family | None:
    """The family whose heads draft for a target of any of these types (top level, `text_config`)."""
    for model_type in model_types:
        for family in FAMILIES:
            if model_type in family.targets:
                return family
    return None


def target_cache_kinds(model_type: str | None) -> tuple[str, ...] | None:
    """The state kinds a target family's layers keep, when the table knows the family."""
    family = family_for_target(model_type)
    return family.targets[model_type] if family is not None else None


def recurrent_target_types() -> tuple[str, ...]:
    """Target types with layers besides attention: their rejected drafts need per-position state."""
    return tuple(t for f in FAMILIES for t, kinds in f.targets.items() if set(kinds) - {"kv"})


def served_target_types() -> tuple[str, ...]:
    """Target types whose MTP heads the worker serves."""
    return tuple(t for f in FAMILIES if f.served for t in f.targets)
