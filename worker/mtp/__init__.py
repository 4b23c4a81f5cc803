"""MTP heads: modules trained with their target that draft from the target's own hidden state.

A head usually has no embeddings or LM head of its own and borrows the target's.
Each family is one module exposing a head class `Head` with the same small surface:

- `Head.from_config(text_config)`: the module for a target family's text config;
- `head(embeddings, hidden, cache) -> hidden`: one forward over any number of
  positions; `hidden` is the target's final (post-norm) hidden state at the
  previous position, or the head's own output when it drafts deeper;
- `head.make_cache()`: a cache per layer that keeps one (the drafter keeps a
  batch KV cache for each);
- `head.sanitize(weights, prefix=, original=)`: the checkpoint's names (a bundled
  head's `prefix`, per-expert or fused experts, an original checkpoint's norm
  convention) to the module's own;
- optionally `head.embed(tokens)` and `head.logits(hidden)`, for a head with its
  own embeddings and output head (GLM's): the drafter uses them instead of the target's.

Families here: `qwen3_5` (Qwen3.5/3.6/3.8 dense and MoE, Qwen3-Next), `nemotron_h`
(Nemotron-H), `glm4_moe_lite` (GLM-4.7-Flash).

Which module serves which head type and target types, and where a bundled head's
tensors sit, is the family table's (`mtpstack.validator.families.FAMILIES`): a
module here names its class `Head`. Another family (DeepSeek, MiMo, ...) is one
more module and one more `Family` in that table.
"""

from mtpstack.worker.mtp.load import LoadedHead, head_class, load_head

__all__ = ["LoadedHead", "head_class", "load_head"]
