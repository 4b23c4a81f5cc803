"""The demo pair shipped with mtpstack: a tiny trained Qwen3.5-family hybrid target and its MTP head.

No model hub is reachable from the machines this project is built on, so the pair was trained here
on local text (see `docs/demo-models.md`): `DEMO_TARGET` is a `qwen3_5` model directory,
`DEMO_HEAD` its standalone `qwen3_5_mtp` head folder. `mtpstack up` with no fleet file serves them.
The tooling that made them (training, the tokenizer, tiny random pairs for tests, the widened copy
the benchmarks use) is development tooling and lives outside the package, in `devkit/demo/`.
"""

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
DEMO_TARGET = DEMO_DIR / "models" / "target"
DEMO_HEAD = DEMO_DIR / "models" / "mtp"

__all__ = ["DEMO_DIR", "DEMO_HEAD", "DEMO_TARGET"]
