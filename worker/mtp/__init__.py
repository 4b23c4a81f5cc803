"""MTP heads: modules trained with their target that draft from the target's own hidden state.

A head has no embeddings or LM head of its own: it borrows the target's. Each
family is one module exposing a head class with the same small surface:

- `Head.from_config(text_config)`: the module for a target family's text config;
- `head(embeddings, hidden, cache) -> hidden`: one forward over any number of
  positions; `hidden` is the target's final (post-norm) hidden state at the
  previous position, or the head's own output when it drafts deeper;
- `head.make_cache()`, `head.sanitize(weights)` (original-checkpoint names and
  norm conventions to the module's own).

Which module serves which head type and target types, and where a bundled head's
tensors sit, is the family table's (`mtpstack.validator.families.FAMILIES`): a
module here names its class `Head`. Another family (DeepSeek, GLM, MiMo) is one
more module and one more `Family` in that table.
"""

from mtpstack.worker.mtp.load import LoadedHead, head_class, load_head

__all__ = ["LoadedHead", "head_class", "load_head"]
