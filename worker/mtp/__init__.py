"""MTP heads: modules trained with their target that draft from the target's own hidden state.

A head usually has no embeddings or LM head of its own and borrows the target's.
Each family is one module exporting two names (`interface`):

- `Head`, its head class, of the interface `MTPHead` (`from_config`, a forward from the
  target's hidden state, `make_cache`, `sanitize`, and its own `embed` / `logits` or None);
- `TARGET`, its targets' `TargetHooks`: the recurrent layers the engine rolls back per row
  (gated-delta projections, Mamba2 mixer classes), which layers keep a cache, where the body sits.

Families here: `qwen3_5` (Qwen3.5/3.6/3.8 dense and MoE, Qwen3-Next), `nemotron_h`
(Nemotron-H), `glm4_moe_lite` (GLM-4.7-Flash). Per-expert MoE tensors are stacked by one
helper (`experts.stack_experts`).

Which module serves which head type and target types, and where a bundled head's tensors
sit, is the family table's (`mtpstack.validator.families.FAMILIES`), read on this side by
`families`. Another family (DeepSeek, MiMo, ...) is one more module and one more `Family`
in that table.
"""

from mtpstack.worker.mtp.families import head_class
from mtpstack.worker.mtp.load import LoadedHead, load_head

__all__ = ["LoadedHead", "head_class", "load_head"]
