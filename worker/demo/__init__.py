"""Demo models for mtpstack: a tiny trained Qwen3.5-family hybrid target with its MTP head, shipped in the repo.

No model hub is reachable from the machines this project is built on, so the demo pair is trained
here on local text (see `docs/demo-models.md`): `DEMO_TARGET` is a `qwen3_5` model directory,
`DEMO_HEAD` its standalone `qwen3_5_mtp` head folder. Tests build even smaller random pairs with
`worker.demo.tiny_hybrid.build_tiny_hybrid_pair` (and qwen3 pairs with
`worker.demo.tiny.build_tiny_pair`); benchmarks make a memory-bound copy with `worker.demo.widen`.
"""

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
TOKENIZER_DIR = DEMO_DIR / "tokenizer"
DEMO_TARGET = DEMO_DIR / "models" / "target"
DEMO_HEAD = DEMO_DIR / "models" / "mtp"

__all__ = ["DEMO_HEAD", "DEMO_TARGET", "TOKENIZER_DIR"]
