"""The models a worker serves with: the target, its drafter and their tokenizer, loaded and checked.

`Engine.load` reads the target (its weights hashed first: what `/identity` reports is what was
read), makes its layers roll back per row (`mtpstack.worker.caches`), loads the drafter (an MTP
head, `mtpstack.worker.mtp`, or a separate draft model) and refuses, at start, what could not be
served. `build_engine` is how every worker process builds its engine and scheduler from its
settings, on one host or as each rank of a distributed worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, load_tokenizer

from mtpstack.validator import DEPTH_AUTO, DEPTH_DEFAULT, DEPTH_MAX, DRAFTER_KINDS, bits_disagreement, config_value, detect_drafter_kind, head_mismatch, model_facts
from mtpstack.worker import cpu_kernels
from mtpstack.worker.caches import CacheNotSupported, install_rollback
from mtpstack.worker.config import WorkerConfig, effective_context
from mtpstack.worker.drafting import Drafter, HeadDrafter, ModelDrafter
from mtpstack.worker.mtp.families import target_hooks
from mtpstack.worker.mtp.interface import TargetHooks
from mtpstack.worker.mtp.load import HeadLoadError, load_head
from mtpstack.worker.prefix_cache import PrefixCache
from mtpstack.worker.prefix_disk import DiskTier
from mtpstack.worker.proof import hash_weights, resolve_model_path
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams, Sequence

log = logging.getLogger("mtpstack.worker")


@dataclass
class LoadedModel:
    """One loaded model and what `/identity` says about it."""

    path: str  # as given on the command line
    resolved_path: Path
    model: object
    config: dict
    bits: str | None  # the command line's claim (`--target-bits`)
    sha256: str
    kind: str | None = None  # a drafter's kind: `mtp` (a head) or `model` (a separate draft model)
    bundled: bool = False  # an MTP head read from the target's own checkpoint
    family: str | None = None  # an MTP head's family (its head `model_type` in the family table)

    @property
    def quantization(self) -> dict | None:
        q = self.config.get("quantization") or self.config.get("quantization_config")
        return q if isinstance(q, dict) else None

    def identity(self) -> dict:
        return {
            "path": self.path,
            "resolved_path": str(self.resolved_path),
            "bits": self.bits,
            "quantization": self.quantization,
            "sha256": self.sha256,
            # Non-null when the command line's bits claim contradicts config.json.
            "bits_mismatch": bits_mismatch(self),
            **({"kind": self.kind, "bundled": self.bundled, "family": self.family} if self.kind else {}),
        }


def load_one(path: str, bits: str | None, prepare=None) -> LoadedModel:
    """`prepare(model)`, when given, runs on the lazily loaded model before its weights are read
    (a distributed worker shards it there, so each rank reads only its part)."""
    resolved = resolve_model_path(path)
    # Hash first: what /identity reports is the content of the files read next.
    digest = hash_weights(resolved)
    model, config = load_model(resolved, lazy=prepare is not None)
    if prepare is not None:
        prepare(model)
        mx.eval(model.parameters())
    return LoadedModel(path=path, resolved_path=resolved, model=model, config=config, bits=bits, sha256=digest)


def bits_mismatch(m: LoadedModel) -> str | None:
    """Why the command line's bits claim contradicts config.json, or None (`validate --deep` makes the same comparison)."""
    recorded = bits_disagreement(m.bits, m.config)
    return None if recorded is None else f"claimed {m.bits}, config.json records {recorded}"


class TargetParts:
    """The target's embedding, its body up to the final norm, and its LM head, used separately.

    Speculative verification needs the final hidden state as well as the logits
    (an MTP head drafts from it), so the engine runs the body and the head itself.
    Where the body and its embeddings sit is the target family's to say (`hooks`).
    """

    def __init__(self, model, hooks: TargetHooks):
        lm = getattr(model, "language_model", model)
        self.body = getattr(lm, hooks.body)
        self.embed = getattr(self.body, hooks.embeddings)
        tied = getattr(getattr(lm, "args", None), "tie_word_embeddings", False)
        self.lm_head = self.embed.as_linear if tied or not hasattr(lm, "lm_head") else lm.lm_head

    def hidden(self, tokens: mx.array, cache: list) -> mx.array:
        return self.body(tokens, cache=cache)


class Engine:
    """A target, an optional drafter (an MTP head or a separate draft model), and their shared tokenizer."""

    def __init__(self, target: LoadedModel, drafter: LoadedModel | None, tokenizer, draft_depth: int, *, cache_kinds: list[str], drafter_factory=None):
        self.target = target
        self.drafter = drafter
        self.draft_kind = drafter.kind if drafter is not None else None
        self.tokenizer = tokenizer
        self.draft_depth = draft_depth if drafter is not None else 0
        self.context_length: int | None = config_value(target.config, "max_position_embeddings")
        self.eos_token_ids = set(tokenizer.eos_token_ids)
        self.parts = TargetParts(target.model, target_hooks(target.config))
        #: Rows of the target's logits, computed once (request checks, grammars, drafter checks read it):
        #: config.json's `vocab_size` (or its `text_config`'s), else the embedding table's rows.
        size = config_value(target.config, "vocab_size")
        self.vocab_size: int = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 \
            else int(self.parts.embed.weight.shape[0])
        self.cache_kinds = cache_kinds
        self._drafter_factory = drafter_factory
        #: A distributed worker's agreement (`mtpstack.worker.distributed`): token arrays in, rank 0's
        #: values out on every rank, so every rank's rows advance alike; None on one host.
        self.agree = None
        #: The adaptive depth's policy (`--draft-depth auto`, `prepare_depth_policy`); None without.
        self.depth_policy = None

    @classmethod
    def load(
        cls,
        target: str,
        drafter: str | None = None,
        *,
        draft_depth: int = DEPTH_DEFAULT,
        target_bits: str | None = None,
        drafter_bits: str | None = None,
        draft_kind: str = "auto",
        prepare_target=None,
    ) -> "Engine":
        if not 0 <= draft_depth <= DEPTH_MAX:
            raise ValueError(f"draft depth must be between 0 and {DEPTH_MAX}: {draft_depth}")
        if draft_kind not in DRAFTER_KINDS:
            raise ValueError(f"draft kind must be one of {', '.join(DRAFTER_KINDS)}: {draft_kind}")
        t = load_one(target, target_bits, prepare_target)
        refuse_unrunnable_experts(t.model, target)
        try:
            kinds = install_rollback(t.model)
        except CacheNotSupported as e:
            raise ValueError(f"the target cannot be served: {e}: `{target}`") from None
        cpu_kernels.install(t.model)
        d, impl = None, None
        if drafter:
            d, impl = load_drafter(drafter, drafter_bits, draft_kind, t)
            refuse_unrunnable_experts(d.model, drafter)
        for role, m in (("target", t), ("drafter", d)):
            if m is not None and (problem := bits_mismatch(m)):
                log.warning("the %s's --%s-bits disagrees with its config.json: %s", role, role, problem)
        tokenizer = load_tokenizer(t.resolved_path, eos_token_ids=t.config.get("eos_token_id"))
        return cls(t, d, tokenizer, draft_depth, cache_kinds=kinds, drafter_factory=impl)

    def make_drafter(self) -> Drafter | None:
        """A drafter with batch caches of its own, for one `Batch`; None without a drafter."""
        return self._drafter_factory(self) if self._drafter_factory is not None else None

    def text_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        return list(self.tokenizer.encode(prompt))

    def new_sequence(self, prompt: list[int], params: SamplingParams) -> Sequence:
        return Sequence(self, prompt, params)


#: Whether this mlx's `gather_qmm` takes the `global_scale` mlx-lm's quantized expert layers pass
#: (mlx 0.32 does; 0.31.2, the Nix package's pin on Linux, does not).
GATHER_QMM_TAKES_GLOBAL_SCALE = "global_scale" in (mx.gather_qmm.__doc__ or "")


def refuse_unrunnable_experts(model, path: str, runs: bool = GATHER_QMM_TAKES_GLOBAL_SCALE) -> None:
    """Refuses, at start rather than at the first prefill, a model with quantized MoE experts on an
    mlx whose `gather_qmm` cannot run mlx-lm's quantized expert layers."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    if runs or not any(isinstance(m, QuantizedSwitchLinear) for _, m in model.named_modules()):
        return
    raise ValueError(
        f"`{path}` has quantized MoE experts, which mlx {mx.__version__} cannot run with this mlx-lm "
        "(its `gather_qmm` takes no `global_scale`)\n\nhint: install mlx>=0.32, or serve an unquantized copy"
    )


def load_drafter(path: str, bits: str | None, kind: str, target: LoadedModel):
    """The drafter as a LoadedModel and a factory for its batched implementation."""
    resolved = resolve_model_path(path)
    detected = detect_drafter_kind(resolved, target.resolved_path)
    if kind == "auto":
        kind = detected
    elif kind == "model" and detected == "mtp":
        raise ValueError(
            f"`--draft-kind model` names an MTP head folder (it has no embeddings or LM head of its own): `{path}`"
            "\n\nhint: use `--draft-kind mtp` or `auto`"
        )
    digest = hash_weights(resolved)
    if kind == "mtp":
        try:
            head = load_head(resolved, target.resolved_path)
        except HeadLoadError as e:
            raise ValueError(str(e)) from None
        head_facts = model_facts(resolved, head.config)
        target_facts = model_facts(target.resolved_path, target.config)
        if head_facts and target_facts and (problem := head_mismatch(head_facts, target_facts)):
            raise ValueError(f"the MTP head does not fit the target: {problem}: `{path}`")
        loaded = LoadedModel(path=path, resolved_path=resolved, model=head.module, config=head.config, bits=bits,
                             sha256=digest, kind="mtp", bundled=head.bundled, family=head.family.head_type)
        return loaded, lambda engine: HeadDrafter(head.module, engine.parts)
    model, config = load_model(resolved)
    loaded = LoadedModel(path=path, resolved_path=resolved, model=model, config=config, bits=bits, sha256=digest, kind="model")
    tv, dv = (f.vocab_size if f is not None else None
              for f in (model_facts(target.resolved_path, target.config), model_facts(resolved, config)))
    if tv is not None and dv is not None and tv != dv:
        raise ValueError(f"the drafter's vocabulary ({dv}) differs from the target's ({tv}): `{path}`")
    try:
        kinds = install_rollback(model)
    except CacheNotSupported as e:
        raise ValueError(f"the draft model cannot be rolled back: {e}: `{path}`") from None
    if any(kind != "kv" for kind in kinds):
        # Refused here, before /health ever answers 200, not at the first request.
        raise ValueError(
            f"the draft model `{path}` keeps recurrent (gated-delta or Mamba2) state, which a separate draft model's rejected "
            f"drafts cannot be rolled back from; the target `{target.path}` may be a hybrid, its draft model may not"
            "\n\nhint: use the target's MTP head (`--draft-kind mtp`), or a draft model with attention layers only"
        )
    return loaded, lambda engine: ModelDrafter(model, kinds)



def build_engine(config: WorkerConfig, *, prepare_target=None, prefix_cache: bool = True) -> tuple[Engine, Scheduler]:
    """The engine and scheduler a worker serves with, as its settings say; every worker process builds
    them here, one host or each rank of a distributed worker (`prepare_target`: its part of the target,
    `prefix_cache` False: none, as the ranks keep none).

    The models are loaded at the deepest class's depth (each request drafts at its own, `parse_request`),
    the context is capped (`--max-context-tokens`: every check reads `engine.context_length`), and the
    scheduler gets `--max-num-seqs` rows and the prefix cache at its budget."""
    engine = Engine.load(
        config.model, config.draft_model, draft_depth=config.deepest_draft_depth,
        target_bits=config.target_bits, drafter_bits=config.drafter_bits, draft_kind=config.draft_kind,
        prepare_target=prepare_target,
    )
    engine.context_length = effective_context(engine.context_length, config.max_context_tokens)
    budget = config.prefix_cache_bytes if prefix_cache else 0
    disk = None
    if budget and config.prefix_cache_dir and config.prefix_cache_disk_bytes:
        disk = DiskTier(config.prefix_cache_dir, config.prefix_cache_disk_bytes, cache_validity(engine)).open()
        if disk.enabled:
            log.info("prefix cache: disk tier at `%s`: %d entries, %.2f GiB of %.2f GiB", disk.folder, disk.stats.entries,
                     disk.total_bytes / 2**30, config.prefix_cache_disk_gib)
    cache = PrefixCache(budget, disk=disk)
    return engine, Scheduler(config.max_num_seqs, prefix_cache=cache)


def prepare_depth_policy(engine: Engine, config: WorkerConfig) -> None:
    """Where a depth is `auto` (`--draft-depth`, or a class's in `--draft-depth-map`): the engine's policy,
    with each depth's step cost measured now (`depth_calibration.calibrate`; every rank of a distributed
    worker runs the same steps, once its agreement is in place)."""
    from mtpstack.worker.depth_calibration import calibrate
    from mtpstack.worker.depth_policy import DepthPolicy

    if engine.drafter is None or DEPTH_AUTO not in (config.draft_depth, *config.draft_depth_map.values()):
        return
    costs = calibrate(engine, config.max_num_seqs, engine.draft_depth)
    engine.depth_policy = DepthPolicy(engine.draft_depth, config.max_num_seqs, costs)


def cache_validity(engine: Engine) -> dict:
    """What a prefix-cache snapshot on disk is valid for: the weights this worker proves (their
    content digests, as `/identity` reports them), their dtypes and quantization, the drafter's
    kind, and the versions that computed it (`prefix_disk_format.LAYOUT` is added by the tier)."""
    import mlx_lm

    from mtpstack import __version__

    def facts(m: LoadedModel | None) -> dict | None:
        if m is None:
            return None
        dtypes = sorted({str(v.dtype) for _, v in tree_flatten(m.model.parameters())})
        return {"sha256": m.sha256, "quantization": m.quantization, "dtypes": dtypes, "kind": m.kind}

    return {"target": facts(engine.target), "drafter": facts(engine.drafter), "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__, "mtpstack": __version__}
