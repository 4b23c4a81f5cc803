"""Where each part of a fleet runs, in one place for Python (its twin is modules/lib/placement.nix).

`workers.<name>.deployOn` and `proxy.deployOn` name a host under top-level `hosts`, or are
null: "every host that runs this fleet", so a fleet that places nothing runs whole on every
host, as before placement existed. A worker's `host` stays its listen address; the proxy
dials a worker placed on another host at that host's `hosts.<name>.address`.
"""

from __future__ import annotations

import ipaddress

from mtpstack.validator.config import FleetConfig


def is_placed(config: FleetConfig) -> bool:
    """Some part names the host it runs on."""
    return config.proxy.deploy_on is not None or any(w.deploy_on is not None for w in config.workers.values())


def runs_on(deploy_on: str | None, host: str) -> bool:
    """A part with this `deployOn` runs on `host`."""
    return deploy_on is None or deploy_on == host


def parts_on(config: FleetConfig, host: str | None) -> tuple[bool, list[str]]:
    """(whether the proxy runs, the workers that run) on `host`; `None`: every part."""
    if host is None:
        return True, list(config.workers)
    return runs_on(config.proxy.deploy_on, host), [n for n, w in config.workers.items() if runs_on(w.deploy_on, host)]


def is_remote(config: FleetConfig, name: str) -> bool:
    """Worker `name` runs on a host other than the proxy's, so the proxy dials it over the network."""
    placed = config.workers[name].deploy_on
    return placed is not None and placed != config.proxy.deploy_on


def dial_host(config: FleetConfig, name: str) -> str:
    """Where the proxy connects to worker `name`: its host's address when it runs elsewhere, else its listen address."""
    worker = config.workers[name]
    if is_remote(config, name) and worker.deploy_on in config.hosts:
        return config.hosts[worker.deploy_on].address
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
