"""The prefix cache holds what it counts: a real worker's resident memory under a flood of distinct long prompts.

Each worker gets the same flood of distinct prompts, sent one after another. A worker with the
cache off shows what the model and the batch cost (its peak resident memory); a worker with a
cache may use that plus what `mtpstack_worker_prefix_cache_bytes` says it holds (never more than
its budget), plus the snapshots of the prompt being prefilled (they enter the cache when its
prefill completes, and may evict others then), plus a little allocator slack. A cache that stored
lazy slices of each step's buffers (the fault this guards against) held about four times what it
counted at these prompt lengths: the worker then passed this bound by the third prompt.
"""

from __future__ import annotations

import random

import pytest

from mtpstack.proxy.prometheus import unlabelled
from mtpstack.series import PREFIX_CACHE_BYTES, PREFIX_CACHE_EVICTIONS

#: Prompt length: 4 snapshot stretches of 512 tokens.
PROMPT_TOKENS = 2048
PROMPTS = 5
#: What the allocators may keep beyond the cached bytes (malloc's heap fragmented by evicted
#: stretches, mlx's buffer cache): the fault this guards against added ~75 MiB per prompt here.
SLACK_MIB = 64
#: A KV wide enough that a prompt's snapshots weigh ~24 MiB while a prefill stays quick.
WIDE_KV = dict(num_attention_heads=8, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192)


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory):
    from devkit.demo.tiny_hybrid import build_tiny_hybrid_pair

    return build_tiny_hybrid_pair(tmp_path_factory.mktemp("wide-kv"), seed=0, **WIDE_KV)


def status_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def flood(worker) -> list[tuple[float, float, float]]:
    """The prompts, one after another; after each: (peak resident MiB, resident MiB, cached MiB)."""
    rng = random.Random(7)
    seen = []
    for _ in range(PROMPTS):
        prompt = [rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)]
        status, _, body = worker.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
        assert status == 200, body
        cached = unlabelled(worker.get_text("/metrics"), [PREFIX_CACHE_BYTES])[PREFIX_CACHE_BYTES] / 2**20
        seen.append((status_mib(worker.proc.pid, "VmHWM"), status_mib(worker.proc.pid, "VmRSS"), cached))
    return seen


@pytest.fixture(scope="module")
def model_and_batch(wide_pair, live_worker_class, tmp_path_factory) -> float:
    """The peak resident memory of a worker with the cache off over the same flood, in MiB."""
    with live_worker_class(tmp_path_factory.mktemp("off"), *wide_pair, depth=2, width=1, prefix_cache_gib=0) as w:
        return flood(w)[-1][0]


@pytest.mark.parametrize("budget_gib", [0.08, 2], ids=["a budget of three prompts", "the default budget"])
def test_resident_memory_stays_within_the_model_the_batch_and_what_the_cache_counts(
        wide_pair, live_worker, model_and_batch, budget_gib):
    with live_worker(*wide_pair, depth=2, width=1, prefix_cache_gib=budget_gib) as w:
        seen = flood(w)
        evictions = unlabelled(w.get_text("/metrics"), [PREFIX_CACHE_EVICTIONS])[PREFIX_CACHE_EVICTIONS]
    budget_mib = budget_gib * 1024
    prompt_mib = seen[0][2]  # one prompt's snapshots, held by its row until its prefill completes
    most = 0.0  # the most the cache has counted so far: the peak may date from then
    for i, (peak, _, cached) in enumerate(seen):
        most = max(most, cached)
        assert cached <= budget_mib
        assert peak <= model_and_batch + most + prompt_mib + SLACK_MIB, (
            f"after prompt {i + 1}: peak resident {peak:.0f} MiB, but the cache-off worker peaked at "
            f"{model_and_batch:.0f} MiB, the cache counted at most {most:.0f} MiB and a prompt's snapshots "
            f"are {prompt_mib:.0f} MiB")
    if budget_gib < 1:
        assert evictions > 0  # the flood passed the small budget: what left the cache left memory too
