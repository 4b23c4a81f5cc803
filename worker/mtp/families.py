"""The worker's side of the family table (`mtpstack.validator.FAMILIES`): each served family's module,
its head class and its target's hooks, found by the module name the table gives."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from mtpstack.validator import FAMILIES, Family, family_for_target, language_config
from mtpstack.worker.mtp.interface import MTPHead, TargetHooks


def family_module(family: Family) -> ModuleType:
    """`mtpstack.worker.mtp.<family.module>`."""
    return importlib.import_module(f"mtpstack.worker.mtp.{family.module}")


def head_class(family: Family) -> type[MTPHead]:
    """The family's head class: `Head` of its module."""
    return family_module(family).Head


@functools.cache
def served_target_hooks() -> tuple[TargetHooks, ...]:
    """Every served family's target hooks (`TARGET` of its module), in the table's order."""
    return tuple(family_module(f).TARGET for f in FAMILIES if f.served)


def target_hooks(config: dict) -> TargetHooks:
    """The hooks of the family a target with this `config.json` belongs to (plain ones for a target
    the table does not know)."""
    family = family_for_target(config.get("model_type"), language_config(config).get("model_type"))
    return family_module(family).TARGET if family is not None and family.served else TargetHooks()
