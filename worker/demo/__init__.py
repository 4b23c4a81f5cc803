"""Demo models for mtpstack: a tiny trained qwen3 target with a 1-layer drafter, shipped in the repo.

No model hub is reachable from the machines this project is built on, so the demo pair is trained
here on local text (see `docs/demo-models.md`). Tests build even smaller random pairs with
`worker.demo.tiny.build_tiny_pair`; benchmarks make a memory-bound copy with `worker.demo.widen`.
"""

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
TOKENIZER_DIR = DEMO_DIR / "tokenizer"
DEMO_TARGET = DEMO_DIR / "models" / "target"
DEMO_DRAFTER = DEMO_DIR / "models" / "drafter"

__all__ = ["DEMO_DRAFTER", "DEMO_TARGET", "TOKENIZER_DIR"]
