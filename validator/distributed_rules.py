"""The rules of a worker that spans hosts (`distributed`): its placement, its backend, its rank ports,
the addresses MLX dials and jaccl's RDMA device matrix. `mtpstack.validator.rules.check` runs them."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator

from mtpstack.validator.config import PORT_MAX, FleetConfig
from mtpstack.validator.findings import Finding, display_name, format_path


def check_distributed(config: FleetConfig) -> Iterator[Finding]:
    """A worker that spans hosts: its first host is its home (`deployOn` null or that host), each
    host listed once, the native backend, rank ports within range, IPv4 addresses where MLX dials
    (every rank's for the ring, rank 0's for jaccl), and jaccl's RDMA device matrix."""
    for name, w in config.workers.items():
        d = w.distributed
        if d is None:
            continue
        path = ("workers", name, "distributed")
        if w.deploy_on is not None and w.deploy_on != d.hosts[0]:
            yield Finding.error(code="distributed-deploy-on", path=("workers", name, "deployOn"),
                                message=(f"the worker spans hosts and its rank 0 (its HTTP side) runs on the first, "
                                         f"`{display_name(d.hosts[0])}`, not on `{display_name(w.deploy_on)}`"),
                                hint=f"set `{format_path(('workers', name, 'deployOn'))}` to null, or list `{display_name(w.deploy_on)}` first in `{format_path(path + ('hosts',))}`",
                                related=(path + ("hosts",),))
        seen: set[str] = set()
        for i, host in enumerate(d.hosts):
            if host in seen:
                yield Finding.error(code="distributed-duplicate-host", path=path + ("hosts", str(i)),
                                    message=f"host `{display_name(host)}` is listed twice; each host runs one rank",
                                    hint="list each host once (ranks on one machine: declare two hosts with loopback addresses, as `mtpstack up` runs them)")
            seen.add(host)
        if w.backend != "native":
            yield Finding.error(code="distributed-needs-native", path=path,
                                message=f"backend `{w.backend}` runs on one host; only the native worker spans hosts",
                                hint="use backend `native`, or drop `distributed`", related=(("workers", name, "backend"),))
        if w.prefix_cache.max_gib > 0:
            cache_path = ("workers", name, "prefixCache", "maxGiB")
            yield Finding.warning(code="distributed-no-prefix-cache", path=cache_path,
                                  message=(f"a worker across hosts keeps no prefix cache (its ranks would have to agree on every hit and "
                                           f"eviction), so the {w.prefix_cache.max_gib:g} GiB here go unused and every turn prefills its whole prompt"),
                                  hint=f"set `{format_path(cache_path)}` to 0 for this worker", related=(path,))
        last = w.base_port + len(d.hosts) - 1
        if last > PORT_MAX:
            yield Finding.error(code="out-of-range", path=path + ("basePort",),
                                message=f"rank {len(d.hosts) - 1} would listen on port {last}, beyond {PORT_MAX}",
                                hint=f"lower `{format_path(path + ('basePort',))}` to at most {PORT_MAX - len(d.hosts) + 1}")
        # MLX's ring (mlx/distributed/utils.cpp) and JACCL's side channel (jaccl/tcp.cpp) split
        # `ip:port` at the first colon and connect `AF_INET` sockets: IPv4 only. The ring dials
        # every rank's address; JACCL's ranks meet at rank 0's (`MLX_JACCL_COORDINATOR`).
        dialled = list(enumerate(d.hosts)) if d.backend == "ring" else [(0, d.hosts[0])]
        for i, host in dialled:
            spec = config.hosts.get(host)
            if spec is None or is_ipv4(spec.address):
                continue
            why = (
                "the ring backend connects its ranks by IPv4 address"
                if d.backend == "ring"
                else "the jaccl backend's ranks meet at rank 0's IPv4 address (its coordinator)"
            )
            yield Finding.error(code="distributed-needs-ip", path=("hosts", host, "address"),
                                message=(f"{why}: MLX splits `address:port` at the first colon and opens IPv4 sockets, and host "
                                         f"`{display_name(host)}` (rank {i} of worker `{display_name(name)}`) has the address `{display_name(spec.address)}`"),
                                hint="give the host its IPv4 address (on a Thunderbolt ring, the bridge's address)",
                                related=(path + ("hosts", str(i)),))
        yield from _check_ibv_devices(name, d, path)


def _check_ibv_devices(name: str, d, path: tuple[str, ...]) -> Iterator[Finding]:
    """`distributed.ibvDevices`, which the jaccl backend needs (it reads `MLX_IBV_DEVICES`, and the
    group's size comes from it): one row per rank, each with one entry per rank and null at the
    rank's own place, as `mlx.launch` requires of its hostfile's `rdma` lists."""
    devices_path = path + ("ibvDevices",)
    n = len(d.hosts)
    if d.backend != "jaccl":
        if d.ibv_devices is not None:
            yield Finding.warning(code="distributed-ibv-devices", path=devices_path,
                                  message=f"the `{d.backend}` backend does not use RDMA devices, so this is ignored",
                                  hint=f"set `{format_path(path + ('backend',))}` to `jaccl` to connect the ranks over RDMA, or drop `ibvDevices`")
        return
    example = json.dumps([[None if c == r else "rdma_en2" for c in range(n)] for r in range(n)])
    if d.ibv_devices is None:
        yield Finding.error(code="distributed-ibv-devices", path=devices_path,
                            message=(f"the jaccl backend reads the RDMA devices that connect the {n} ranks from a file (`MLX_IBV_DEVICES`), "
                                     "and none are given"),
                            hint=(f"set `{format_path(devices_path)}`: one row per rank in `hosts` order, null for the rank itself, "
                                  f"else the device toward that rank (`ibv_devices` on each Mac lists them), e.g. {example}"))
        return
    if len(d.ibv_devices) != n:
        yield Finding.error(code="distributed-ibv-devices", path=devices_path,
                            message=f"the worker has {n} ranks but {len(d.ibv_devices)} rows of RDMA devices; each rank needs its row",
                            hint=f"give one row per rank in `{format_path(path + ('hosts',))}` order, e.g. {example}")
        return
    for r, row in enumerate(d.ibv_devices):
        if len(row) != n or row[r] is not None:
            yield Finding.error(code="distributed-ibv-devices", path=devices_path + (str(r),),
                                message=(f"rank {r}'s row must name a device toward each of the {n} ranks, and null at its own place "
                                         f"(entry {r}), got: {json.dumps(row)}"),
                                hint=f"e.g. {json.dumps(json.loads(example)[r])}")


def is_ipv4(address: str) -> bool:
    """An IPv4 address as MLX's distributed backends take it: dotted quad, nothing around it."""
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return True
