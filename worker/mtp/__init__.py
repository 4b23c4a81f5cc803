"""MTP heads: modules trained with their target that draft from the target's own hidden state.

A head has no embeddings or LM head of its own: it borrows the target's. Each
family is one module exposing a head class with the same small surface:

- `Head.from_config(text_config)`: the module for a target family's text config;
- `head(embeddings, hidden, cache) -> hidden`: one forward over any number of
  positions; `hidden` is the target's final (post-norm) hidden state at the
  previous position, or the head's own output when it drafts deeper;
- `head.make_cache()`, `head.sanitize(weights)` (original-checkpoint names and
  norm conventions to the module's own).

`HEADS` maps a standalone folder's `model_type` to its class; `BUNDLED` maps a
target family to the class that reads the `mtp.*` tensors of its original
checkpoints. Another family (DeepSeek, GLM, MiMo) is one more module and one
more line in each map.
"""

from mtpstack.worker.mtp.load import BUNDLED, HEADS, LoadedHead, load_head

__all__ = ["BUNDLED", "HEADS", "LoadedHead", "load_head"]
