"""Tooling for the demo models: the byte-level BPE tokenizer and its corpus, training of the shipped
pair (`python -m devkit.demo.train`), tiny random pairs built at test time (`tiny`, `tiny_hybrid`),
the memory-bound widened copy the benchmarks use (`widen`) and the served acceptance figure
(`acceptance`). The shipped model files themselves are package data of `mtpstack.worker.demo`."""

from pathlib import Path

TOKENIZER_DIR = Path(__file__).resolve().parent / "tokenizer"

__all__ = ["TOKENIZER_DIR"]
