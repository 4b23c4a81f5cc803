"""The rules the validator enforces on a structurally valid config, each with a stable code."""

from __future__ import annotations

import difflib
import ipaddress
import os
from collections.abc import Iterator

import re

from mtpstack.runtime import WILDCARD_HOSTS
from mtpstack.validator.config import CONTEXT_MIN, DEPTH_AUTO, DEPTH_AUTO_MAX_DEFAULT, DEPTH_CLASS_PATTERN, TENANT_NAME_PATTERN, DEPTH_MAX, DEPTH_MIN, WIDTH_MAX, WIDTH_MIN, Bits, FleetConfig
from mtpstack.validator.coupling import fleet_width, gate_for, gate_source
from mtpstack.validator.distributed_rules import check_distributed
from mtpstack.validator.keys import KeysFileError, read_keys_file
from mtpstack.validator.findings import Finding, display_key, display_name, format_path
from mtpstack.validator.placement import is_loopback, is_placed, is_remote, parts_on, rank_on


#: Effective bits of each precision, for comparing drafter against target.
EFFECTIVE_BITS: dict[Bits, int] = {2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 8: 8, "mxfp4": 4, "bf16": 16, "fp16": 16, "fp32": 32}
#: Below this a drafter quantized as hard as its target loses acceptance.
SAFE_DRAFTER_BITS = 6


def did_you_mean(word: str, candidates: list[str]) -> str | None:
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return match[0] if match else None


def check(config: FleetConfig) -> list[Finding]:
    findings: list[Finding] = []
    for rule in (
        check_ranges,
        check_coupling,
        check_unknown_model_limits,
        check_drafter_precision,
        check_backends,
        check_mlx_lm_drafts,
        check_mlx_lm_mtp,
        check_mlx_lm_context,
        check_depth_map,
        check_hosts,
        check_distributed,
        check_ports,
        check_prefix_cache_dirs,
        check_tenants,
    ):
        findings.extend(rule(config))
    return findings


def _out_of_range(path: tuple[str, ...], value: int, lo: int, hi: int, what: str) -> Finding:
    return Finding.error(code="out-of-range", path=path, message=f"{what} must be between {lo} and {hi}, got: {value}",
                         hint=f"set `{format_path(path)}` to a value from {lo} to {hi}")


def check_ranges(config: FleetConfig) -> Iterator[Finding]:
    proxy = config.proxy
    if not WIDTH_MIN <= proxy.concurrency_limit <= WIDTH_MAX:
        yield _out_of_range(("proxy", "concurrencyLimit"), proxy.concurrency_limit, WIDTH_MIN, WIDTH_MAX, "the admission gate")
    for model, limit in proxy.model_concurrency_limits.items():
        if not WIDTH_MIN <= limit <= WIDTH_MAX:
            yield _out_of_range(("proxy", "modelConcurrencyLimits", model), limit, WIDTH_MIN, WIDTH_MAX, "the admission gate")
    for name, worker in config.workers.items():
        if not WIDTH_MIN <= worker.max_num_seqs <= WIDTH_MAX:
            yield _out_of_range(("workers", name, "maxNumSeqs"), worker.max_num_seqs, WIDTH_MIN, WIDTH_MAX, "the batch width")
        if worker.drafter is not None:
            depth = worker.drafter.depth
            path = ("workers", name, "drafter", "depth")
            for key, value in _depth_entries(depth):
                if value != DEPTH_AUTO and not DEPTH_MIN <= value <= DEPTH_MAX:
                    yield _out_of_range(path + key, value, DEPTH_MIN, DEPTH_MAX, "the draft depth")
            if not DEPTH_MIN <= worker.drafter.max_depth <= DEPTH_MAX:
                yield _out_of_range(("workers", name, "drafter", "maxDepth"), worker.drafter.max_depth, DEPTH_MIN, DEPTH_MAX,
                                    "the deepest automatic depth")
        if worker.max_context_tokens is not None and worker.max_context_tokens < CONTEXT_MIN:
            path = ("workers", name, "maxContextTokens")
            yield Finding.error(code="out-of-range", path=path,
                                message=f"the context cap must be at least {CONTEXT_MIN}, got: {worker.max_context_tokens}",
                                hint=f"set `{format_path(path)}` to a positive token count, or to null for the model's own maximum")


def check_coupling(config: FleetConfig) -> Iterator[Finding]:
    for name, worker in config.workers.items():
        gate = gate_for(config.proxy, worker.model)
        if worker.max_num_seqs == gate:
            continue
        width_path = ("workers", name, "maxNumSeqs")
        source = gate_source(config.proxy, worker.model)
        src = format_path(source)
        if len(source) == 2:
            origin = f"`{src}` (model `{display_name(worker.model)}` has no entry in `proxy.modelConcurrencyLimits`)"
        else:
            origin = f"`{src}`"
        yield Finding.error(code="concurrency-mismatch", path=width_path,
                            message=(f"these two must agree: the worker's batch width is {worker.max_num_seqs} "
                                     f"but the proxy admits {gate} at once to it, from {origin}"),
                            hint=(f"raise or lower `{format_path(width_path)}` and `{src}` together, to the same value "
                                  f"from {WIDTH_MIN} to {WIDTH_MAX}; any matched pair is valid, with or without a drafter"),
                            related=(source,))


def check_unknown_model_limits(config: FleetConfig) -> Iterator[Finding]:
    served = config.models
    for model in config.proxy.model_concurrency_limits:
        if model in served:
            continue
        guess = did_you_mean(model, served)
        served_list = ", ".join(f"`{display_name(m)}`" for m in served) or "none"
        if guess:
            hint = f"did you mean `{display_name(guess)}`?"
        else:
            hint = "remove the entry, or add a worker that serves this model"
        yield Finding.error(code="unknown-model-limit", path=("proxy", "modelConcurrencyLimits", model),
                            message=f"no worker serves model `{display_name(model)}` (served: {served_list})", hint=hint)


def check_drafter_precision(config: FleetConfig) -> Iterator[Finding]:
    for name, worker in config.workers.items():
        # A bundled head ships inside the target's checkpoint, quantized with it: there is no
        # separate drafter to quantize differently.
        if worker.drafter is None or worker.bundled_head:
            continue
        d = EFFECTIVE_BITS[worker.drafter.bits]
        t = EFFECTIVE_BITS[worker.target.bits]
        if d <= t and d < SAFE_DRAFTER_BITS:
            yield Finding.warning(code="drafter-precision", path=("workers", name, "drafter", "bits"),
                                  message=(f"the drafter is quantized as hard as its target or harder ({worker.drafter.bits} vs "
                                           f"{worker.target.bits}); acceptance drops and the speedup quietly goes"),
                                  hint="use a drafter of 6 bits or more (a 6-bit drafter works beside 2- to 8-bit targets)",
                                  related=(("workers", name, "target", "bits"),))


def check_backends(config: FleetConfig) -> Iterator[Finding]:
    allowed = config.policy.allowed_backends
    for name, worker in config.workers.items():
        if worker.backend in allowed:
            continue
        listed = ", ".join(f"`{b}`" for b in allowed) or "none"
        yield Finding.error(code="backend-forbidden", path=("workers", name, "backend"),
                            message=f"backend `{worker.backend}` is wired but unreachable: `policy.allowedBackends` allows only {listed}",
                            hint=f"add `{worker.backend}` to `policy.allowedBackends`, or set this worker's backend to one it allows",
                            related=(("policy", "allowedBackends"),))


def check_mlx_lm_drafts(config: FleetConfig) -> Iterator[Finding]:
    for name, worker in config.workers.items():
        if worker.backend == "mlx-lm" and worker.drafter is not None and worker.max_num_seqs > 1:
            yield Finding.error(code="mlx-lm-serializes-drafts", path=("workers", name, "maxNumSeqs"),
                                message=(f"`mlx_lm.server` serves one request at a time once a draft model is loaded, "
                                         f"so its real batch width is 1, not {worker.max_num_seqs}"),
                                hint="use backend `native` for a wider batch with a drafter, or set the width and its gate to 1",
                                related=(("workers", name, "backend"), ("workers", name, "drafter")))


def mlx_lm_cannot_load_mtp(name: str, why: str) -> Finding:
    """`mlx_lm.server` given an MTP head; `why` says how the head was recognised."""
    return Finding.error(code="mlx-lm-cannot-load-mtp", path=("workers", name, "drafter"),
                         message=f"`mlx_lm.server` cannot load an MTP head, only a separate draft model: {why}",
                         hint="use backend `native`, or drop the drafter", related=(("workers", name, "backend"),))


def check_mlx_lm_mtp(config: FleetConfig) -> Iterator[Finding]:
    for name, worker in config.workers.items():
        if worker.backend != "mlx-lm" or not worker.declared_mtp:
            continue
        if worker.bundled_head:
            why = "`drafter.path` is the target's own path, so the drafter is the head bundled in its checkpoint"
        else:
            why = "`drafter.kind` is `mtp`"
        yield mlx_lm_cannot_load_mtp(name, why)


def check_mlx_lm_context(config: FleetConfig) -> Iterator[Finding]:
    for name, worker in config.workers.items():
        if worker.backend == "mlx-lm" and worker.max_context_tokens is not None:
            yield Finding.error(code="mlx-lm-cannot-cap-context", path=("workers", name, "maxContextTokens"),
                                message=(f"`mlx_lm.server` has no flag to cap the context, so it would serve up to the model's own "
                                         f"maximum, not {worker.max_context_tokens} tokens"),
                                hint="use backend `native` to cap the context, or set `maxContextTokens` to null",
                                related=(("workers", name, "backend"),))


def canonical_host(host: str) -> str:
    """One spelling per listening address (`localhost` and `[::1]` as IP addresses, names lower-cased)."""
    host = host.strip("[]")
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def check_ports(config: FleetConfig) -> Iterator[Finding]:
    """Listeners that overlap on one host. A placed fleet is checked host by host, each with the
    parts that run there; a conflict among parts that run on every host is reported once."""
    if not is_placed(config):
        yield from _port_conflicts(config, parts_on(config, None), None)
        return
    spanned = [h for w in config.workers.values() if w.distributed is not None for h in w.distributed.hosts]
    hosts = list(dict.fromkeys([*config.hosts, *(p.deploy_on for p in [config.proxy, *config.workers.values()] if p.deploy_on), *spanned]))
    seen: set[tuple] = set()
    for host in hosts:
        for f in _port_conflicts(config, parts_on(config, host), host):
            if (f.path, f.related) not in seen:
                seen.add((f.path, f.related))
                yield f


def _port_conflicts(config: FleetConfig, parts: tuple[bool, list[str]], host_name: str | None) -> Iterator[Finding]:
    """Each listener against the first earlier one it overlaps with (same port, same host or
    either a wildcard). Linear: per port, the first listener, the first wildcard and the first
    on each canonical host are all that an overlap can be with first."""
    with_proxy, names = parts
    listeners: list[tuple[tuple[str, ...], str, int]] = [(("proxy", "port"), config.proxy.host, config.proxy.port)] if with_proxy else []
    for name in names:
        worker = config.workers[name]
        rank = rank_on(worker, host_name) if host_name is not None else None
        if rank in (None, 0):  # the HTTP side runs with rank 0 only
            listeners.append((("workers", name, "port"), worker.host, worker.port))
        if rank is not None and host_name in config.hosts:
            # A rank listens for its peers at its host's address (the ring's hostfile).
            listeners.append((("workers", name, "distributed", "basePort"), config.hosts[host_name].address, worker.base_port + rank))
    first_on_port: dict[int, tuple[int, tuple[str, ...], str]] = {}
    first_wildcard: dict[int, tuple[int, tuple[str, ...], str]] = {}
    first_on_host: dict[tuple[int, str], tuple[int, tuple[str, ...], str]] = {}
    for order, (path, host, port) in enumerate(listeners):
        me = (order, path, host)
        if host in WILDCARD_HOSTS:
            clash = first_on_port.get(port)
            first_wildcard.setdefault(port, me)
        else:
            key = (port, canonical_host(host))
            clash = min((c for c in (first_wildcard.get(port), first_on_host.get(key)) if c is not None), default=None)
            first_on_host.setdefault(key, me)
        first_on_port.setdefault(port, me)
        if clash is None:
            continue
        _, other_path, other_host = clash
        owner = format_path(other_path[:-1])
        on = f" of host `{display_name(host_name)}`" if host_name is not None else ""
        yield Finding.error(code="port-conflict", path=path,
                            message=(f"port {port} on `{display_name(host)}`{on} is already taken by `{owner}` "
                                     f"on `{display_name(other_host)}`"),
                            hint="give each listener its own port", related=(other_path,))


def check_hosts(config: FleetConfig) -> Iterator[Finding]:
    """Placement: every `deployOn` names a declared host; once a worker is placed the proxy is
    too; the proxy can reach each worker; a declared host runs something."""
    declared = list(config.hosts)
    placements = [(("proxy", "deployOn"), config.proxy.deploy_on)]
    placements += [(("workers", name, "deployOn"), w.deploy_on) for name, w in config.workers.items()]
    placements += [
        (("workers", name, "distributed", "hosts", str(i)), h)
        for name, w in config.workers.items() if w.distributed is not None
        for i, h in enumerate(w.distributed.hosts)
    ]
    for path, host in placements:
        if host is None or host in config.hosts:
            continue
        guess = did_you_mean(host, declared)
        listed = ", ".join(f"`{display_name(h)}`" for h in declared) or "none"
        yield Finding.error(code="unknown-host", path=path,
                            message=f"no host `{display_name(host)}` is declared under `hosts` (declared: {listed})",
                            hint=f"did you mean `{display_name(guess)}`?" if guess else f"declare it as `hosts.{display_key(host)}.address`")
    placed_workers = [name for name, w in config.workers.items() if w.home is not None]
    if placed_workers and config.proxy.deploy_on is None:
        yield Finding.error(code="proxy-not-placed", path=("proxy", "deployOn"),
                            message=(f"worker `{placed_workers[0]}` is placed on a host but the proxy is not, so every host would run a proxy; "
                                     "two proxies each fill the same worker's gate and together admit more than its batch width"),
                            hint="set `proxy.deployOn` to the one host that runs the proxy",
                            related=(("workers", placed_workers[0], "deployOn" if config.workers[placed_workers[0]].deploy_on else "distributed"),))
    for name, w in config.workers.items():
        if is_remote(config, name) and config.proxy.deploy_on is not None and is_loopback(w.host):
            yield Finding.error(code="worker-unreachable", path=("workers", name, "host"),
                                message=(f"the worker runs on host `{display_name(w.home)}` and listens on `{display_name(w.host)}` only, "
                                         f"so the proxy on host `{display_name(config.proxy.deploy_on)}` cannot reach it"),
                                hint="listen on `0.0.0.0` (or the host's own address) and open the port to the proxy host only (`openFirewall` on NixOS)",
                                related=(("workers", name, "deployOn"), ("proxy", "deployOn")))
    if not is_placed(config):
        return
    for host in declared:
        with_proxy, names = parts_on(config, host)
        if not with_proxy and not names:
            yield Finding.warning(code="host-runs-nothing", path=("hosts", host),
                                  message=f"no part of the fleet is placed on host `{display_name(host)}`",
                                  hint="place a worker or the proxy there with `deployOn`, or remove the host")


def check_depth_map(config: FleetConfig) -> Iterator[Finding]:
    """`drafter.depth` as a map: `default` present, plain class names, and the native backend; `auto`:
    the native backend, and `maxDepth` given only where some depth is `auto`."""
    for name, worker in config.workers.items():
        if worker.drafter is None:
            continue
        yield from _check_auto_depth(name, worker)
        if not isinstance(worker.drafter.depth, dict):
            continue
        depths = worker.drafter.depth
        path = ("workers", name, "drafter", "depth")
        if "default" not in depths:
            yield Finding.error(code="depth-map-no-default", path=path,
                                message="a depth per workload class needs a `default` for requests of no listed class",
                                hint=f"add `default` to `{format_path(path)}` (e.g. `default: 3`), or give a single depth")
        for cls in depths:
            if not re.fullmatch(DEPTH_CLASS_PATTERN, cls):
                yield Finding.error(code="depth-class-name", path=path + (cls,),
                                    message=f"a workload class name may hold only letters, digits, `_`, `.` and `-` (1-64 characters), got: {cls!r}",
                                    hint="rename the class; requests name it in `mtpstack_class` or the `X-Mtpstack-Class` header")
        if worker.backend == "mlx-lm":
            yield Finding.error(code="mlx-lm-depth-map", path=path,
                                message="`mlx_lm.server` drafts at one depth for every request; it cannot serve a depth per workload class",
                                hint="use backend `native` for a depth per class, or give a single depth",
                                related=(("workers", name, "backend"),))


def _depth_entries(depth) -> list[tuple[tuple[str, ...], int | str]]:
    """`drafter.depth`'s values with their paths below it: `[((), 3)]`, or `[(("code",), 4), ...]` for a map."""
    return [((c,), v) for c, v in depth.items()] if isinstance(depth, dict) else [((), depth)]


def _check_auto_depth(name: str, worker) -> Iterator[Finding]:
    path = ("workers", name, "drafter", "depth")
    if worker.drafter.auto and worker.backend == "mlx-lm":
        yield Finding.error(code="mlx-lm-depth-auto", path=path,
                            message="`mlx_lm.server` drafts a fixed `--num-draft-tokens`; it cannot choose each step's depth (`auto`)",
                            hint="use backend `native` for `auto`, or give a number of tokens",
                            related=(("workers", name, "backend"),))
    fixed = [(key, d) for key, d in _depth_entries(worker.drafter.depth) if d != DEPTH_AUTO]
    max_path = ("workers", name, "drafter", "maxDepth")
    for key, d in fixed if worker.drafter.auto else []:
        if d > worker.drafter.max_depth:
            yield Finding.error(code="max-depth-below-fixed", path=max_path,
                                message=f"`maxDepth` {worker.drafter.max_depth} is below the fixed depth {d} of "
                                        f"`{format_path(path + key)}`: the head is loaded for the deepest of them",
                                hint=f"raise `{format_path(max_path)}` to {d} or more, or lower `{format_path(path + key)}`",
                                related=(path + key,))
    # Against the default, not against being written: the Nix modules render every option.
    if not worker.drafter.auto and worker.drafter.max_depth != DEPTH_AUTO_MAX_DEFAULT:
        yield Finding.warning(code="max-depth-unused", path=("workers", name, "drafter", "maxDepth"),
                              message="`maxDepth` bounds only an `auto` depth, and no depth of this drafter is `auto`",
                              hint=f"set `{format_path(path)}` (or a class's) to `auto`, or remove `maxDepth`",
                              related=(path,))


def disk_tier_dir(worker) -> str | None:
    """The directory of a worker's prefix-cache disk tier as configured (normalised), or None when it
    keeps none: no `dir`, a budget of 0, no prefix cache, another backend, or a distributed worker."""
    c = worker.prefix_cache
    if worker.backend != "native" or worker.distributed is not None or not c.max_gib or not c.disk_gib or c.dir is None:
        return None
    return os.path.normpath(os.path.expanduser(c.dir))


def check_prefix_cache_dirs(config: FleetConfig) -> Iterator[Finding]:
    """Two workers on one host never share a prefix-cache directory: each would remove the other's
    snapshots as another model's, or both would write one index. Checked host by host, as ports are."""
    hosts: list[str | None] = [None]
    if is_placed(config):
        hosts = list(dict.fromkeys([*config.hosts, *(w.deploy_on for w in config.workers.values() if w.deploy_on)]))
    seen: set[tuple[str, str]] = set()
    for host in hosts:
        first: dict[str, str] = {}
        for name in parts_on(config, host)[1]:
            folder = disk_tier_dir(config.workers[name])
            if folder is None:
                continue
            other = first.setdefault(folder, name)
            if other == name or (other, name) in seen:
                continue
            seen.add((other, name))
            on = f" on host `{display_name(host)}`" if host is not None else ""
            yield Finding.error(code="prefix-cache-dir-shared", path=("workers", name, "prefixCache", "dir"),
                                message=f"workers `{display_name(other)}` and `{display_name(name)}` would share the prefix-cache directory `{folder}`{on}",
                                hint=f"give each worker its own `prefixCache.dir` (or set it to null: the Nix modules and `mtpstack up` then give each its own)",
                                related=(("workers", other, "prefixCache", "dir"),))


def check_tenants(config: FleetConfig) -> Iterator[Finding]:
    """`proxy.tenants`: names as the keys file spells them, a `maxConcurrent` the fleet can run at once,
    and (when the keys file can be read here) a well-formed file that names every configured tenant."""
    proxy = config.proxy
    width = fleet_width(config)
    for name, tenant in proxy.tenants.items():
        path = ("proxy", "tenants", name)
        if not re.fullmatch(TENANT_NAME_PATTERN, name):
            yield Finding.error(code="tenant-name", path=path,
                                message=f"a tenant name may hold only letters, digits, `_`, `.` and `-` (1-64 characters), got: {name!r}",
                                hint="rename the tenant here and in the keys file")
        if tenant.max_concurrent is not None and tenant.max_concurrent > width:
            yield Finding.error(code="tenant-beyond-fleet", path=path + ("maxConcurrent",),
                                message=(f"tenant `{display_name(name)}` may have {tenant.max_concurrent} requests in flight, but the fleet's "
                                         f"workers admit {width} at once in all (the sum of their gates)"),
                                hint=f"lower `{format_path(path + ('maxConcurrent',))}` to at most {width}, or set it to null for no limit")
    if proxy.api_keys_file is None:
        return
    keys_path = ("proxy", "apiKeysFile")
    try:
        lines = read_keys_file(proxy.api_keys_file)
    except KeysFileError as e:
        if not os.path.exists(proxy.api_keys_file):
            return  # a secret of the host that runs the proxy, not of this one: the proxy checks it at start
        yield Finding.error(code="api-keys-file", path=keys_path, message=e.message, hint=e.hint)
        return
    named = {line.tenant for line in lines}
    for name in proxy.tenants:
        if name not in named:
            yield Finding.warning(code="tenant-without-key", path=("proxy", "tenants", name),
                                  message=f"no line of the keys file `{proxy.api_keys_file}` names tenant `{display_name(name)}`, so its settings apply to no request",
                                  hint=f"add a `{display_name(name)} KEY` line to the keys file, or remove the tenant",
                                  related=(keys_path,))
