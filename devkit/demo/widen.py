"""A function-preserving larger copy of a qwen3 or qwen3_5 model, so that decode is memory-bound as on real hardware.

The demo target is so small that one decode step costs little more than one drafter step, and
speculation cannot pay. Real targets are large enough that decode time is spent reading weights.
This copy restores that balance without changing what the model computes:

- every MLP's intermediate width grows `mlp_multiplier` times; the new `gate_proj`/`up_proj` rows
  are random (so they cost real work) and the matching `down_proj` columns are zero, so they add
  nothing to the output;
- `extra_layers` new decoder layers are appended after the last one, with random attention and MLP
  inputs but zero `o_proj` and `down_proj`, so each adds exactly zero to the residual stream. In a
  qwen3_5 hybrid the new layers continue the model's pattern (`full_attention_interval`): a
  gated-delta layer gets a zero `linear_attn.out_proj`, a full-attention layer a zero `self_attn.o_proj`.

Greedy output is unchanged (up to float summation order in the widened matmuls). The copy is made
on demand for benchmarks and never committed:

    python -m devkit.demo.widen worker/demo/models/target /tmp/demo-target-wide \\
        --mlp-multiplier 8 --extra-layers 10
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import mlx.core as mx

from devkit.demo.bpe import TOKENIZER_FILES
from mtpstack.errors import UserError, print_error

# Scale of the random weights in the added rows and layers: small, like a trained model's.
INIT_STD = 0.02
# Projections whose output goes into the residual stream: zero in an appended layer.
RESIDUAL_OUTPUTS = ("self_attn.o_proj.weight", "linear_attn.out_proj.weight", "mlp.down_proj.weight")
WIDENABLE = ("qwen3", "qwen3_5")


class WidenError(UserError):
    """A user-facing problem with the source model; the message follows the project's error style."""


def _random(shape: tuple[int, ...], key: mx.array) -> mx.array:
    return mx.random.normal(shape, dtype=mx.float32, key=key) * INIT_STD


def _check_source(src_dir: Path) -> dict:
    config_path = src_dir / "config.json"
    if not config_path.is_file():
        raise WidenError(f"No `config.json` in the source model directory: `{src_dir}`")
    config = json.loads(config_path.read_text())
    if config.get("model_type") not in WIDENABLE:
        raise WidenError(f"Only qwen3 and qwen3_5 models can be widened; the source is: `{config.get('model_type')}`")
    if config.get("model_type") == "qwen3_5" and config.get("text_config", {}).get("num_experts", 0):
        raise WidenError(f"Only dense qwen3_5 models can be widened; the source has experts: `{src_dir}`")
    if "quantization" in config or "quantization_config" in config:
        raise WidenError(
            f"The source model is quantized: `{src_dir}`\n\n"
            "hint: widen the float model, then quantize the copy with `mlx_lm.convert`"
        )
    if not (src_dir / "model.safetensors").is_file():
        raise WidenError(f"No `model.safetensors` in the source model directory: `{src_dir}`")
    return config


def _layer_prefix(weights: dict[str, mx.array]) -> str:
    """`model.layers.` (qwen3) or `language_model.model.layers.` (qwen3_5): where the decoder layers are."""
    for name in weights:
        if m := re.match(r"(.*\blayers\.)\d+\.", name):
            return m.group(1)
    raise WidenError("The source model has no decoder layers")


def widen(src_dir: Path, out_dir: Path, *, mlp_multiplier: int, extra_layers: int, seed: int = 0) -> Path:
    """Write the widened copy of the qwen3 or qwen3_5 model in `src_dir` to `out_dir` and return `out_dir`."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if mlp_multiplier < 1 or extra_layers < 0:
        raise WidenError(
            f"The multiplier must be at least 1 and the extra layers at least 0, got: "
            f"`{mlp_multiplier}` and `{extra_layers}`"
        )
    config = _check_source(src_dir)
    text = config.get("text_config", config)  # qwen3_5 nests its shape in `text_config`
    weights = {k: v.astype(mx.float32) for k, v in mx.load(str(src_dir / "model.safetensors")).items()}

    hidden = text["hidden_size"]
    inter = text["intermediate_size"]
    wide = inter * mlp_multiplier
    layers = text["num_hidden_layers"]
    # qwen3 has one kind of layer; in a qwen3_5 hybrid every `interval`-th layer is full attention.
    interval = text.get("full_attention_interval", 1) if config["model_type"] == "qwen3_5" else 1
    keys = iter(mx.random.split(mx.random.key(seed), 4 * layers + 24 * extra_layers + 1))

    out: dict[str, mx.array] = {}
    for name, w in weights.items():
        if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")) and wide > inter:
            w = mx.concatenate([w, _random((wide - inter, hidden), next(keys))], axis=0)
        elif name.endswith("mlp.down_proj.weight") and wide > inter:
            w = mx.concatenate([w, mx.zeros((hidden, wide - inter), dtype=mx.float32)], axis=1)
        out[name] = w
        mx.eval(w)

    # A new layer copies the shapes (and norm weights) of the last original layer of its kind.
    prefix = _layer_prefix(out)
    for i in range(layers, layers + extra_layers):
        source = max(j for j in range(layers) if (j + 1) % interval == (i + 1) % interval)
        last = f"{prefix}{source}."
        for suffix, w in ((k[len(last):], v) for k, v in list(out.items()) if k.startswith(last)):
            if suffix in RESIDUAL_OUTPUTS:
                new = mx.zeros(w.shape, dtype=mx.float32)
            elif suffix.endswith("norm.weight"):
                new = mx.ones(w.shape, dtype=mx.float32)
            else:
                new = _random(tuple(w.shape), next(keys))
            out[f"{prefix}{i}.{suffix}"] = new
            mx.eval(new)

    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), out, metadata={"format": "mlx"})
    shape = dict(intermediate_size=wide, num_hidden_layers=layers + extra_layers)
    new_config = dict(config, text_config=dict(text, **shape)) if "text_config" in config else dict(config, **shape)
    (out_dir / "config.json").write_text(json.dumps(new_config, indent=2) + "\n")
    for name in TOKENIZER_FILES + ("generation_config.json", "chat_template.jinja"):
        if (src_dir / name).is_file():
            shutil.copyfile(src_dir / name, out_dir / name)
    return out_dir


def parameter_count(model_dir: Path) -> int:
    return sum(v.size for v in mx.load(str(Path(model_dir) / "model.safetensors")).values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.demo.widen",
        description="Make a function-preserving larger copy of a qwen3 or qwen3_5 model (memory-bound decode).",
    )
    parser.add_argument("src", type=Path, help="source model directory")
    parser.add_argument("out", type=Path, help="output model directory")
    parser.add_argument("--mlp-multiplier", type=int, required=True, help="MLP intermediate width factor")
    parser.add_argument("--extra-layers", type=int, required=True, help="zero-output layers to append")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random (output-free) weights")
    args = parser.parse_args(argv)
    try:
        out = widen(args.src, args.out, mlp_multiplier=args.mlp_multiplier, extra_layers=args.extra_layers,
                    seed=args.seed)
    except WidenError as exc:
        print_error(exc)
        return 2
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote `{out}`: {parameter_count(out) / 1e6:.1f}M parameters, {size / 1e6:.0f} MB", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
