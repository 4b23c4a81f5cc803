"""Where each part of a fleet runs, in one place for Python (its twin is modules/lib/placement.nix).

`workers.<name>.deployOn` and `proxy.deployOn` name a host under top-level `hosts`, or are
null: "every host that runs this fleet", so a fleet that places nothing runs whole on every
host, as before placement existed. A worker's `host` stays its listen address; the proxy
dials a worker placed on another host at that host's `hosts.<name>.address`.

A distributed worker (`workers.<name>.distributed.hosts`) runs a rank on each host it lists,
rank 0 (its HTTP side) on the first: its placement is that list, and its `deployOn` may only
repeat the first host.
"""

from __future__ import annotations

import ipaddress

from mtpstack.validator.config import FleetConfig, WorkerProfile


def is_placed(config: FleetConfig) -> bool:
    """Some part names the host it runs on."""
    return config.proxy.deploy_on is not None or any(w.home is not None for w in config.workers.values())


def runs_on(deploy_on: str | None, host: str) -> bool:
    """A part with this `deployOn` runs on `host`."""
    return deploy_on is None or deploy_on == host


def worker_runs_on(worker: WorkerProfile, host: str) -> bool:
    """Some part of `worker` (a rank, for a distributed one) runs on `host`."""
    if worker.distributed is not None:
        return host in worker.distributed.hosts
    return runs_on(worker.deploy_on, host)


def rank_on(worker: WorkerProfile, host: str) -> int | None:
    """The rank a distributed worker runs on `host` (its first listing), else None."""
    d = worker.distributed
    return d.hosts.index(host) if d is not None and host in d.hosts else None


def rank_peers(config: FleetConfig, name: str) -> list[str] | None:
    """`address:port` of each rank of distributed worker `name`, in rank order: the ring backend's
    hostfile, one entry per rank (`[[peer], ...]` as `mlx.launch` writes it). None when a host is
    undeclared (an error of its own)."""
    worker = config.workers[name]
    if worker.distributed is None or any(h not in config.hosts for h in worker.distributed.hosts):
        return None
    return [f"{config.hosts[h].address}:{worker.base_port + r}" for r, h in enumerate(worker.distributed.hosts)]


def parts_on(config: FleetConfig, host: str | None) -> tuple[bool, list[str]]:
    """(whether the proxy runs, the workers that run) on `host`; `None`: every part."""
    if host is None:
        return True, list(config.workers)
    return runs_on(config.proxy.deploy_on, host), [n for n, w in config.workers.items() if worker_runs_on(w, host)]


def is_remote(config: FleetConfig, name: str) -> bool:
    """Worker `name` runs on a host other than the proxy's, so the proxy dials it over the network."""
    placed = config.workers[name].home
    return placed is not None and placed != config.proxy.deploy_on


def dial_host(config: FleetConfig, name: str) -> str:
    """Where the proxy connects to worker `name`: its host's address when it runs elsewhere, else its listen address."""
    worker = config.workers[name]
    if is_remote(config, name) and worker.home in config.hosts:
        return config.hosts[worker.home].address
    return worker.host


def is_loopback(host: str) -> bool:
    """`host` accepts connections from this machine only."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
