"""`--deep` checks: compare what the config claims with the model directories on disk.

Model directories are read through `mtpstack.validator.modeldir` only, so settings kept in
`text_config` (the Qwen3.5 family and its MTP heads) are checked like top-level ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mtpstack.validator.config import FleetConfig, WorkerProfile
from mtpstack.validator.findings import Finding
from mtpstack.validator.families import served_target_types, target_cache_kinds
from mtpstack.validator.modeldir import bits_disagreement, config_value, detect_drafter_kind, head_layout, head_mismatch, model_facts, read_config
from mtpstack.validator.rules import disk_tier_dir, mlx_lm_cannot_load_mtp

def local_dir(path: str, base: Path) -> Path | None:
    """The local model directory `path` names (as given, or relative to the config's folder), if any."""
    for candidate in (Path(path).expanduser(), base / path):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def check_deep(config: FleetConfig, base: Path) -> list[Finding]:
    """What each worker's model files say (the host budgets are `memory.check_memory`'s)."""
    findings: list[Finding] = []
    for name, worker in config.workers.items():
        findings += check_worker(name, worker, base)
        findings += check_disk_space(name, worker, base)
    return findings


def check_disk_space(name: str, worker: WorkerProfile, base: Path) -> list[Finding]:
    """A disk tier's budget beyond what its filesystem has free on this machine (what its snapshots
    already take counted as free): the worker would serve from memory once the disk is full."""
    folder = disk_tier_dir(worker)
    if folder is None:
        return []
    path = Path(folder) if Path(folder).is_absolute() else base / folder
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    if existing is None:
        return []
    try:
        free = shutil.disk_usage(existing).free
        held = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0
    except OSError:
        return []
    budget = worker.prefix_cache.disk_gib * 2**30
    if budget <= free + held:
        return []
    return [Finding.warning(code="prefix-cache-disk-space", path=("workers", name, "prefixCache", "diskGiB"),
                            message=(f"the disk tier may use {worker.prefix_cache.disk_gib:g} GiB but the filesystem of `{existing}` has "
                                     f"{(free + held) / 2**30:.1f} GiB free on this machine (its snapshots already there counted)"),
                            hint="lower `prefixCache.diskGiB` or free space there: once the disk is full the worker serves from memory only")]


def check_worker(name: str, worker: WorkerProfile, base: Path) -> list[Finding]:
    """Each local model directory of one worker: readable, at the configured precision; then its drafter."""
    findings: list[Finding] = []
    parts = [("target", worker.target.path, worker.target.bits)]
    if worker.drafter is not None:
        parts.append(("drafter", worker.drafter.path, worker.drafter.bits))
    local: dict[str, tuple[Path, dict]] = {}
    for role, path, bits in parts:
        directory = local_dir(path, base)
        if directory is None:
            continue  # a hub id: nothing on disk to compare
        model_config = read_config(directory)
        if model_config is None:
            findings.append(
                Finding.error(code="model-config-missing", path=("workers", name, role, "path"),
                              message=f"`{directory}` has no readable `config.json`",
                              hint="point the path at a model directory (the one holding config.json and *.safetensors)")
            )
            continue
        local[role] = (directory, model_config)
        if role == "drafter" and worker.bundled_head:
            continue  # the target's own files, checked as the target
        recorded = bits_disagreement(bits, model_config)
        if recorded is not None:
            findings.append(
                Finding.error(code="bits-mismatch", path=("workers", name, role, "bits"),
                              message=f"the config says {bits} but `{directory}/config.json` records {recorded}",
                              hint=f"set `bits` to {recorded}, or point `path` at the {bits} variant")
            )
    if "target" in local:
        findings += check_context(name, worker, local["target"])
    if "drafter" in local:
        findings += check_drafter(name, worker, local["drafter"], local.get("target"))
    return findings


def check_context(name: str, worker: WorkerProfile, target: tuple[Path, dict]) -> list[Finding]:
    """`maxContextTokens` against the target's own maximum (`max_position_embeddings`), when it records one."""
    directory, model_config = target
    own = config_value(model_config, "max_position_embeddings")
    cap = worker.max_context_tokens
    if cap is None or not isinstance(own, int) or cap <= own:
        return []
    return [
        Finding.error(code="context-beyond-model", path=("workers", name, "maxContextTokens"),
                      message=f"the context cap is {cap} tokens but `{directory}/config.json` allows at most {own} (`max_position_embeddings`)",
                      hint=f"set `maxContextTokens` to at most {own}, or to null for the model's own maximum")
    ]


def check_drafter(name: str, worker: WorkerProfile, drafter: tuple[Path, dict], target: tuple[Path, dict] | None) -> list[Finding]:
    """The drafter's kind (declared, else detected) against its files, then against the target."""
    assert worker.drafter is not None
    directory, drafter_config = drafter
    facts = model_facts(directory, drafter_config)
    target_facts = model_facts(*target) if target is not None else None
    detected = detect_drafter_kind(directory, target[0] if target is not None else None)
    declared = "mtp" if worker.declared_mtp else worker.drafter.kind
    path = ("workers", name, "drafter", "path")
    target_path = ("workers", name, "target", "path")
    assert facts is not None
    if declared == "mtp" and detected == "model":
        if worker.bundled_head:
            what = f"`drafter.path` is the target's own, but `{directory}` holds no bundled `mtp.*` tensors"
        else:
            what = f"`drafter.kind` is `mtp` but `{directory}` is not an MTP head (its `model_type` is `{facts.model_type}`)"
        return [
            Finding.error(code="mtp-head-mismatch", path=path, message=f"{what}; the worker would find no head to load",
                          hint="point `drafter.path` at the MTP head made for this target, or set `drafter.kind` to `model` for a separate draft model",
                          related=(("workers", name, "drafter", "kind"),))
        ]
    if declared == "model" and detected == "mtp":
        return [
            Finding.error(code="drafter-kind-mismatch", path=("workers", name, "drafter", "kind"),
                          message=(f"`drafter.kind` is `model` but `{directory}` is an MTP head (`model_type` `{facts.model_type}`): "
                                   "it drafts from the target's hidden state and cannot run as a language model"),
                          hint="set `drafter.kind` to `mtp`, or leave it `auto`", related=(path,))
        ]
    findings: list[Finding] = []
    if detected == "mtp":
        if worker.backend == "mlx-lm" and not worker.declared_mtp:
            findings.append(mlx_lm_cannot_load_mtp(name, f"`{directory}` holds an MTP head (read from its files)"))
        problem = head_mismatch(facts, target_facts) if target_facts is not None else None
        if problem is not None:
            findings.append(
                Finding.error(code="mtp-head-mismatch", path=path,
                              message=f"this MTP head cannot draft for the target: {problem}",
                              hint="use the MTP head made for this target", related=(target_path,))
            )
        return findings or check_family(name, worker, directory, drafter_config, facts)
    if facts.recurrent:
        findings.append(
            Finding.error(code="recurrent-draft-model", path=path,
                          message=(f"`{directory}` is a `{facts.model_type}` model with {' and '.join(recurrent_kinds(facts.model_type))} "
                                   "layers, whose state a separate "
                                   "draft model's rejected drafts cannot be rolled back from; the worker would refuse it at start"),
                          hint="use the target's MTP head as the drafter (`drafter.kind: mtp`), or a draft model with attention layers only")
        )
    vocab = (facts.vocab_size, target_facts.vocab_size if target_facts is not None else None)
    if None not in vocab and vocab[0] != vocab[1]:
        findings.append(
            Finding.error(code="vocab-mismatch", path=path,
                          message=(f"the drafter's vocabulary has {vocab[0]} tokens but the target's has {vocab[1]}; "
                                   "its drafts could never be accepted"),
                          hint="use the drafter that was trained with this target", related=(target_path,))
        )
    return findings


def recurrent_kinds(model_type: str | None) -> list[str]:
    return [k for k in target_cache_kinds(model_type) or () if k != "kv"] or ["recurrent"]


def check_family(name: str, worker: WorkerProfile, directory: Path, drafter_config: dict, facts) -> list[Finding]:
    """The MTP family and layout the worker would load (a note), or why it would refuse the family."""
    path = ("workers", name, "drafter", "path")
    family = facts.head_family
    if family is None:
        served = ", ".join(f"`{t}`" for t in served_target_types())
        return [Finding.error(code="mtp-family-not-served", path=path,
                              message=f"`{directory}` bundles `mtp.*` tensors, but no MTP family is known for `{facts.model_type}` targets",
                              hint=f"use a target of a served family ({served}), or a separate draft model (`drafter.kind: model`)")]
    if not family.served:
        return [Finding.error(code="mtp-family-not-served", path=path,
                              message=f"`{directory}` holds a `{family.head_type}` head, which the worker does not serve: {family.why_not}",
                              hint="serve this target without a drafter, or with a separate draft model of attention layers only (`drafter.kind: model`)")]
    layout = head_layout(directory, drafter_config, bundled=worker.bundled_head)
    return [Finding(
        code="mtp-family",
        severity="note",
        path=path,
        message=f"a `{family.head_type}` head: {layout}",
    )]
