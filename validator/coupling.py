"""The coupling rule, in one place for Python (its twin is modules/lib/coupling.nix).

A worker's batch width `maxNumSeqs` must equal the proxy's admission gate for
its model: `proxy.modelConcurrencyLimits[model]`, else `proxy.concurrencyLimit`.
It is a coupling, not a cap: 2, 3 or 4 on both sides is as valid as 1.
"""

from __future__ import annotations

from mtpstack.validator.config import ProxyConfig, WorkerProfile


def gate_for(proxy: ProxyConfig, model: str) -> int:
    """The number of requests the proxy admits at once to each worker of `model`."""
    return proxy.model_concurrency_limits.get(model, proxy.concurrency_limit)


def gate_source(proxy: ProxyConfig, model: str) -> tuple[str, ...]:
    """The config path that sets the gate for `model`."""
    if model in proxy.model_concurrency_limits:
        return ("proxy", "modelConcurrencyLimits", model)
    return ("proxy", "concurrencyLimit")


def is_coupled(proxy: ProxyConfig, worker: WorkerProfile) -> bool:
    return worker.max_num_seqs == gate_for(proxy, worker.model)


def fleet_width(config) -> int:
    """Requests the whole fleet admits at once: the sum of every worker's gate. A tenant may use every
    served model, so its `maxConcurrent` is held to this (`tenant-beyond-fleet`)."""
    return sum(gate_for(config.proxy, w.model) for w in config.workers.values())
