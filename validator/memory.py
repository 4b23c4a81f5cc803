"""`--deep` memory budget: what each worker needs (weights of its target and drafter, plus the
KV cache at its batch width and its context: the model's own maximum, lowered to `maxContextTokens`, plus its
prefix cache budget) against `hosts.<name>.memoryGiB`.

Model files are read, never downloaded: a local directory, else a hub id's snapshot in the local
Hugging Face cache. A worker whose files are not at hand leaves its host unchecked, and says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from mtpstack.validator.config import FleetConfig, WorkerProfile, effective_context
from mtpstack.validator.deep import local_dir
from mtpstack.validator.findings import Finding, display_name
from mtpstack.validator.modeldir import config_value, read_config
from mtpstack.validator.placement import is_placed, parts_on, rank_on

GIB = 1024**3
#: The KV cache's element size: mlx keeps keys and values in the activations' dtype (fp16/bf16).
KV_BYTES_PER_ELEMENT = 2


def hub_snapshot(repo_id: str) -> Path | None:
    """The newest local snapshot of a hub id in the Hugging Face cache, offline; None when absent."""
    if repo_id.count("/") != 1:
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    snapshots = hub / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    found = sorted((d for d in snapshots.glob("*") if d.is_dir()), key=lambda d: d.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else None


def model_files(path: str, base: Path) -> Path | None:
    return local_dir(path, base) or hub_snapshot(path)


def weight_bytes(directory: Path) -> int:
    """Bytes of the model's weights: its safetensors files (links followed, as in the HF cache)."""
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def context_tokens(model_config: dict, cap: int | None) -> int | None:
    """The context a worker serves (`effective_context`): the model's own maximum, lowered to its `maxContextTokens`."""
    return effective_context(config_value(model_config, "max_position_embeddings"), cap)


def kv_cache_bytes(model_config: dict, width: int, cap: int | None = None) -> int | None:
    """Keys and values for `width` sequences at the worker's context (the model's maximum, lowered to `cap`),
    every layer counted (an upper bound for hybrid models whose linear-attention layers keep a fixed-size state)."""
    layers = config_value(model_config, "num_hidden_layers")
    context = context_tokens(model_config, cap)
    heads = config_value(model_config, "num_attention_heads")
    kv_heads = config_value(model_config, "num_key_value_heads") or heads
    head_dim = config_value(model_config, "head_dim")
    hidden = config_value(model_config, "hidden_size")
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    if not all(isinstance(v, int) and v > 0 for v in (layers, context, kv_heads, head_dim)):
        return None
    return 2 * layers * kv_heads * head_dim * KV_BYTES_PER_ELEMENT * context * width


def shard_share(worker: WorkerProfile, rank: int, layers: int | None) -> float:
    """The part of the target (weights and KV cache) that rank `rank` of a distributed worker holds:
    `tensor` splits every layer evenly; `pipeline` gives each rank a run of layers, as mlx-lm's
    `pipeline` does (the low ranks take the extra layers). 1 for a worker on one host."""
    d = worker.distributed
    if d is None:
        return 1.0
    n = len(d.hosts)
    if d.strategy == "tensor" or not layers:
        return 1 / n
    base, extra = divmod(layers, n)
    return (base + (1 if rank < extra else 0)) / layers


def worker_need(worker: WorkerProfile, base: Path, rank: int = 0) -> tuple[int | None, str]:
    """(bytes, how they add up) for one worker (for a distributed one, its rank `rank`: its shard of the
    target and its KV cache, the drafter whole), or (None, which files are missing)."""
    target = model_files(worker.target.path, base)
    if target is None or (model_config := read_config(target)) is None:
        return None, f"no local files for `{display_name(worker.target.path)}`"
    share = shard_share(worker, rank, config_value(model_config, "num_hidden_layers"))
    weights = int(weight_bytes(target) * share)
    parts = [f"target weights {weights / GIB:.1f} GiB" + (f" (rank {rank}'s shard)" if worker.distributed else "")]
    if worker.drafter is not None and not worker.bundled_head:
        drafter = model_files(worker.drafter.path, base)
        if drafter is None:
            return None, f"no local files for `{display_name(worker.drafter.path)}`"
        drafter_weights = weight_bytes(drafter)
        weights += drafter_weights
        parts.append(f"drafter weights {drafter_weights / GIB:.1f} GiB")
    kv = kv_cache_bytes(model_config, worker.max_num_seqs, worker.max_context_tokens)
    kv = None if kv is None else int(kv * share)
    if kv is None:
        return None, f"`{target}/config.json` lacks the sizes the KV cache needs"
    context = context_tokens(model_config, worker.max_context_tokens)
    parts.append(f"KV cache {kv / GIB:.1f} GiB ({worker.max_num_seqs} x {context} tokens)")
    # mlx_lm.server's own prompt cache is bounded by the same figure (`--prompt-cache-bytes`).
    # A distributed worker keeps no prefix cache (docs/worker.md): its ranks would have to agree on every eviction.
    cache = int(worker.prefix_cache.max_gib * GIB) if worker.distributed is None else 0
    if cache:
        parts.append(f"prefix cache {worker.prefix_cache.max_gib:g} GiB")
    return weights + kv + cache, ", ".join(parts)


def check_memory(config: FleetConfig, base: Path) -> Iterator[Finding]:
    for host, spec in config.hosts.items():
        if spec.memory_gib is None:
            continue
        _, names = parts_on(config, host if is_placed(config) else None)
        needs = {name: worker_need(config.workers[name], base, rank_on(config.workers[name], host) or 0) for name in names}
        missing = [(name, why) for name, (need, why) in needs.items() if need is None]
        path = ("hosts", host, "memoryGiB")
        if missing:
            name, why = missing[0]
            yield Finding.warning(code="memory-check-skipped", path=path,
                                  message=f"the memory of host `{display_name(host)}` was not checked: worker `{name}` has {why}",
                                  hint="download the models first (`huggingface-cli download ID`), or point `path` at a local directory")
            continue
        total = sum(need for need, _ in needs.values())
        if total > spec.memory_gib * GIB:
            each = "; ".join(f"`{name}` {need / GIB:.1f} GiB ({why})" for name, (need, why) in needs.items())
            yield Finding.error(code="host-memory-exceeded", path=path,
                                message=(f"the workers on host `{display_name(host)}` need about {total / GIB:.1f} GiB "
                                         f"but it has {spec.memory_gib:g} GiB: {each}"),
                                hint="place a worker on another host, lower a batch width (and its gate) or a `prefixCache.maxGiB`, or use a smaller quantization")
