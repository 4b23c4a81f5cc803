"""A copy of an MTP head that pays less than the original, for the adaptive depth's bench: a head
that does not quite fit its target, as one quantized as hard as the body or taken from another
checkpoint behaves.

- `--noise R`: Gaussian noise of R times the weight's own standard deviation added to the head's input
  projection (`fc`, which mixes the target's hidden state with the next token's embedding);
- `--bits B`: every 2-D `*.weight` whose rows split into whole groups quantized with `mx.quantize`
  (affine), config.json carrying the `quantization` entry mlx-lm and mlx-vlm write, which the worker's
  head loader reads (`mtpstack.worker.mtp.load.quantize`). On the demo head 2 bits cost only ~10% of its
  acceptance; noise reaches a head that pays little.

    python -m devkit.demo.weak_head worker/demo/models/mtp /tmp/demo-head-weak --noise 1.0
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx


#: The head's input projection, where `--noise` goes.
INPUT_PROJECTION = "fc.weight"


def weaken_head(src: Path, dest: Path, *, noise: float = 0.0, bits: int | None = None, group_size: int = 32, seed: int = 0) -> Path:
    src, dest = Path(src), Path(dest)
    if (dest / "config.json").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    weights: dict[str, mx.array] = {}
    for f in sorted(src.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    if noise:
        w = weights[INPUT_PROJECTION]
        mx.random.seed(seed)
        weights[INPUT_PROJECTION] = (w + noise * mx.std(w) * mx.random.normal(w.shape)).astype(w.dtype)
    out: dict[str, mx.array] = {}
    for key, w in weights.items():
        base = key.removesuffix(".weight")
        if bits and key.endswith(".weight") and w.ndim == 2 and w.shape[-1] % group_size == 0 and "norm" not in key:
            q, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
            out.update({key: q, f"{base}.scales": scales, f"{base}.biases": biases})
        else:
            out[key] = w
    mx.save_safetensors(str(dest / "model.safetensors"), out, metadata={"format": "mlx"})
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, dest / f.name)
    config = json.loads((src / "config.json").read_text())
    if bits:
        quantization = {"group_size": group_size, "bits": bits, "mode": "affine"}
        config.update(quantization=quantization, quantization_config=quantization)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the head's directory")
    parser.add_argument("out", type=Path, help="where the quantized copy goes")
    parser.add_argument("--noise", type=float, default=0.0, help="noise in the input projection, in its weights' std")
    parser.add_argument("--bits", type=int, default=None, help="quantize the linear layers to this many bits")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(weaken_head(args.src, args.out, noise=args.noise, bits=args.bits, group_size=args.group_size, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
