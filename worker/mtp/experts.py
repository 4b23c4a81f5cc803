"""Per-expert MoE tensors stacked as mlx-lm's switch layers hold them: the one stacker every head's `sanitize` uses."""

from __future__ import annotations

import re

import mlx.core as mx


def stack_experts(weights: dict[str, mx.array], names: dict[str, str]) -> dict[str, mx.array]:
    """`<mlp>.experts.<E>.<proj>.<weight|scales|biases>` for each `proj` in `names`, stacked over the
    experts (expert 0 first) as `<mlp>.switch_mlp.<names[proj]>.<...>`; every other tensor as it was.

    Raises ValueError when a projection's experts are not exactly 0..n-1."""
    per_expert = re.compile(rf"(.*)\.experts\.(\d+)\.({'|'.join(map(re.escape, names))})\.(weight|scales|biases)")
    out: dict[str, mx.array] = {}
    groups: dict[tuple[str, str, str], dict[int, mx.array]] = {}
    for key, value in weights.items():
        if m := per_expert.fullmatch(key):
            mlp, expert, proj, what = m.groups()
            groups.setdefault((mlp, proj, what), {})[int(expert)] = value
        else:
            out[key] = value
    for (mlp, proj, what), experts in groups.items():
        if sorted(experts) != list(range(len(experts))):
            raise ValueError(f"`{mlp}.experts.*.{proj}` has experts {sorted(experts)}, not 0..{len(experts) - 1}")
        out[f"{mlp}.switch_mlp.{names[proj]}.{what}"] = mx.stack([experts[e] for e in range(len(experts))])
    return out
