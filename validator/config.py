"""The config model: the shape of the file the Nix module renders and operators write.

Keys are camelCase, as operators write them in Nix. The model is strict (no
coercion of "3" into 3) and forbids unknown keys. Ranges that carry the
coupling rule (maxNumSeqs, concurrency limits, draft depth) and maxContextTokens are deliberately
*not* enforced here: the rules in `mtpstack.validator.rules` report them with their own
codes, so that a range error never hides a mismatch and vice versa.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from mtpstack.validator.modeldir import DRAFTER_KINDS

Backend = Literal["native", "mlx-lm"]
#: `proxy.routing`: which free worker a request goes to (`mtpstack.proxy.routing`).
Routing = Literal["affinity", "first-free"]
Bits = Literal[2, 3, 4, 5, 6, 8, "mxfp4", "bf16", "fp16", "fp32"]
#: `auto`, `mtp` or `model`: the values are `mtpstack.validator.modeldir`'s, which resolves `auto`.
DrafterKindSetting = Literal[DRAFTER_KINDS]

#: The batch-width range every gate and every worker must sit in.
WIDTH_MIN, WIDTH_MAX = 1, 4
#: The draft depth range: the one limit the config, the worker's flags and its engine share
#: (a worker also takes depth 0: no drafting). `modules/lib/defaults.nix` restates it, tested equal.
DEPTH_MIN, DEPTH_MAX = 1, 8
#: The depth of a worker started without `--draft-depth` (a config always names one).
#: mlx_lm.server's own `--num-draft-tokens` default is its own, not this.
DEPTH_DEFAULT = 3
#: `drafter.depth = "auto"`: the worker picks each step's depth from live acceptance and step costs.
DEPTH_AUTO = "auto"
#: The deepest an `auto` depth drafts unless `drafter.maxDepth` says otherwise: past 4 the demo and
#: published heads accept too little for a deeper step to pay (docs/worker.md, "Adaptive draft depth").
DEPTH_AUTO_MAX_DEFAULT = 4
Depth = Annotated[int, Field(json_schema_extra={"minimum": DEPTH_MIN, "maximum": DEPTH_MAX})]
#: A depth as a config writes it: a number of tokens, or `auto`.
DepthSetting = Depth | Literal["auto"]
#: A workload class name in `drafter.depth`: it travels in `--draft-depth-map NAME=D,...` and in a header.
DEPTH_CLASS_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
#: A tenant's name in `proxy.tenants` and in the keys file: it becomes a Prometheus label value.
TENANT_NAME_PATTERN = DEPTH_CLASS_PATTERN

Width = Annotated[int, Field(json_schema_extra={"minimum": WIDTH_MIN, "maximum": WIDTH_MAX})]
#: The smallest per-worker context cap; there is no upper bound but the model's own maximum (`--deep`).
CONTEXT_MIN = 1
ContextTokens = Annotated[int, Field(json_schema_extra={"minimum": CONTEXT_MIN})]


def effective_context(model_maximum: int | None, cap: int | None) -> int | None:
    """The context a worker serves, the one rule for the worker and `validate --deep`: the model's own
    maximum, lowered to the cap (`maxContextTokens`, `--max-context-tokens`) when one is given. A cap
    beyond the model's maximum never raises it (`--deep` refuses one: `context-beyond-model`)."""
    if cap is None:
        return model_maximum
    return cap if model_maximum is None else min(model_maximum, cap)
#: The worker's prefix cache budget in GiB: a bare `mtpstack worker` and a profile without
#: `prefixCache` both get the default; 0 turns the cache off. The ceiling keeps the rendered
#: flag (`format_gib`, C's `%g`, which Nix's `builtins.toJSON` also writes) exact.
PREFIX_CACHE_GIB_DEFAULT = 2
#: The budget of the prefix cache's disk tier in GiB (`prefixCache.diskGiB`), when it has a directory;
#: 0 turns the disk tier off. Its ceiling is the memory budget's, for the same reason.
PREFIX_CACHE_DISK_GIB_DEFAULT = 32
PREFIX_CACHE_GIB_MAX = 65536
PrefixCacheGiB = Annotated[float, Field(ge=0, le=PREFIX_CACHE_GIB_MAX, allow_inf_nan=False)]
Port = Annotated[int, Field(ge=1, le=65535)]
PORT_MAX = 65535
Host = Annotated[str, Field(min_length=1)]
#: `workers.<n>.distributed.backend`: MLX's distributed backends. `ring` (TCP over Ethernet or
#: Thunderbolt) runs anywhere mlx does; `jaccl` (RDMA over Thunderbolt 5) needs macOS and is
#: validated and rendered, not run by this project's tests.
DistributedBackend = Literal["ring", "jaccl"]
#: How a distributed worker splits its target: mlx-lm's `model.shard(group)` (every layer split
#: across the ranks) or `model.pipeline(group)` (each rank a run of whole layers).
ShardStrategy = Literal["tensor", "pipeline"]
#: One entry of a `jaccl` worker's device matrix (`distributed.ibvDevices`): null (a rank toward
#: itself), an RDMA device name, or several (JACCL's `parse_devices_json` takes all three).
IbvDevices = Annotated[str, Field(min_length=1)] | list[Annotated[str, Field(min_length=1)]] | None
#: Where a distributed worker's rank ports start when `basePort` is not set: this far above its
#: HTTP port (below it when that would pass 65535). `modules/lib/distributed.nix` restates it.
RANK_PORT_OFFSET = 10000


def camel_alias(name: str) -> str:
    """A field's key as operators write it: camelCase, with `GiB` kept (`maxGiB`, not to_camel's `maxGib`)."""
    return to_camel(name).replace("Gib", "GiB")


class StrictModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=camel_alias,
        populate_by_name=True,
        # YAML reads `.nan` and `.inf` as floats; neither is a usable timeout.
        allow_inf_nan=False,
    )


class QueueConfig(StrictModel):
    max_waiting: int = Field(16, ge=0, description="Requests that may wait per model when every gate is full; beyond it: 429 queue_full.")
    timeout_seconds: float = Field(30.0, gt=0, description="How long a request may wait for a slot before 429 queue_timeout.")


class TimeoutsConfig(StrictModel):
    connect_seconds: float = Field(5.0, gt=0, description="Time to open a connection to a worker before 504.")
    first_byte_seconds: float = Field(
        300.0,
        gt=0,
        description="Time to the first byte of the worker's answer; a non-streamed answer's first byte comes when generation ends.",
    )
    idle_seconds: float = Field(60.0, gt=0, description="Longest pause between two chunks of a streamed answer before 504.")
    client_seconds: float = Field(
        30.0,
        gt=0,
        description=(
            "Deadline for a client to send a whole request (head and body), counted from the connection's opening or "
            "the previous answer's end; a late body gets 408, a late head has its connection closed."
        ),
    )


#: `deployOn`: a name under top-level `hosts`; null: every host that imports the fleet.
DeployOn = Annotated[str, Field(min_length=1)] | None
_DEPLOY_ON = (
    "The host (a name under top-level `hosts`) that runs this; null: every host that runs the fleet. "
    "Once any worker is placed, the proxy must be placed on exactly one host."
)


class HostConfig(StrictModel):
    address: Host = Field(description="Where the other hosts reach this one: the proxy dials its workers here, and firewall rules admit the proxy host from here.")
    memory_gib: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="Memory the host's workers may use, in GiB; `validate --deep` refuses a host whose workers need more. Null: not checked.",
    )


class TenantConfig(StrictModel):
    max_concurrent: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Requests of this tenant in flight (waiting or admitted) across the fleet at once; beyond: 429. Null: unlimited.")
    tokens_per_minute: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Prompt tokens not served from a prefix cache plus completion tokens, per sliding minute; beyond: 429. Null: unlimited.")
    requests_per_minute: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Requests per sliding minute; beyond: 429. Null: unlimited.")
    weight: Annotated[int, Field(ge=1, le=1000)] = Field(
        1, description="Share of a gate when several tenants wait on it: slots go round-robin by weight, first come first served within a tenant.")


class ProxyConfig(StrictModel):
    host: Host = Field("127.0.0.1", description="Address the proxy listens on.")
    deploy_on: DeployOn = Field(None, description=_DEPLOY_ON)
    port: Port = Field(8080, description="Port the proxy listens on.")
    concurrency_limit: Width = Field(
        1,
        description=f"Admission gate ({WIDTH_MIN}-{WIDTH_MAX}) per worker for any model not in modelConcurrencyLimits; "
        "must equal those workers' maxNumSeqs.",
    )
    model_concurrency_limits: dict[str, Width] = Field(
        default_factory=dict,
        description=f"Served model name -> admission gate ({WIDTH_MIN}-{WIDTH_MAX}) per worker of that model; "
        "must equal those workers' maxNumSeqs.",
    )
    queue: QueueConfig = Field(default_factory=QueueConfig)
    routing: Routing = Field(
        "affinity",
        description=(
            "Which worker with a free slot a request goes to: `affinity`, the one that served its conversation "
            "(`prompt_cache_key`, else `user`, else the prompt's beginning), where its prefix is cached; "
            "`first-free`, the least loaded. Neither makes a request wait while any worker of its model has a free slot, "
            "unless affinityWaitSeconds is set."
        ),
    )
    affinity_wait_seconds: float = Field(
        0.0,
        ge=0,
        description=(
            "Under `affinity` routing, how long a request whose worker (the one holding its conversation's prefix) is "
            "full may wait for a slot there while another worker is free, before it goes to that one and prefills "
            "its prompt again; at most half of queue.timeoutSeconds is waited. 0: never wait (the default)."
        ),
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    max_body_bytes: int = Field(1_048_576, ge=1, description="Largest request body accepted; larger: 413 body_too_large.")
    shutdown_grace_seconds: float = Field(30.0, ge=0, description="How long in-flight requests may finish after a stop signal.")
    api_keys_file: str | None = Field(
        None, description="File of accepted API keys, one `NAME KEY` per line (a key alone: tenant `default`); null: no authentication.")
    tenants: dict[str, TenantConfig] = Field(
        default_factory=dict,
        description="Limits and queue weight per tenant (a name in apiKeysFile); a tenant not listed is unlimited with weight 1.")
    fair_queueing: bool = Field(
        True, description="When several tenants wait for one model, serve them round-robin by weight (false: one first-come line per model).")


class PolicyConfig(StrictModel):
    allowed_backends: list[Backend] = Field(
        default_factory=lambda: ["native"],
        description="Backends this fleet may run: native | mlx-lm.",
    )


class TargetSpec(StrictModel):
    path: str = Field(min_length=1, description="Local directory or hub id of the target model.")
    bits: Bits = Field(description="Quantization of the target: 2, 3, 4, 5, 6, 8, mxfp4, bf16, fp16 or fp32.")


class DrafterSpec(StrictModel):
    path: str = Field(
        min_length=1,
        description=(
            "Local directory or hub id of the drafter: an MTP head, a small model trained with the target, "
            "or the target's own path for an MTP head bundled in its checkpoint (`mtp.*` tensors)."
        ),
    )
    bits: Bits = Field(description="Quantization of the drafter; keep it at 6 bits or above the target's.")
    depth: DepthSetting | dict[str, DepthSetting] = Field(
        description=(
            f"Draft depth: tokens the drafter proposes per verification step ({DEPTH_MIN}-{DEPTH_MAX}), or `auto`: each step "
            "as deep as the rows' live acceptance pays for, 0 included (native backend only); or a depth per workload class, "
            "`{code: 4, prose: auto, default: 3}` (`default` required; native backend only)."
        )
    )
    max_depth: Depth = Field(
        DEPTH_AUTO_MAX_DEFAULT,
        description=f"The deepest an `auto` depth drafts ({DEPTH_MIN}-{DEPTH_MAX}); the head is loaded for it. Unused without `auto`.",
    )
    kind: DrafterKindSetting = Field(
        "auto",
        description=(
            "What the drafter is: `mtp` (a head drafting from the target's hidden state) or `model` "
            "(a separate small language model); `auto`: detected from the drafter's config and tensors."
        ),
    )


    @property
    def default_depth(self) -> int | str:
        """The depth of a request of no listed class: `depth`, or the map's `default` (a number or `auto`)."""
        if not isinstance(self.depth, dict):
            return self.depth
        # A map without `default` is refused (`depth-map-no-default`); the largest value stands in meanwhile.
        return self.depth.get("default", max((d for d in self.depth.values() if isinstance(d, int)), default=DEPTH_MIN))

    @property
    def class_depths(self) -> dict[str, int | str]:
        """The classes with a depth of their own (all but `default`), sorted by name; empty for a plain depth."""
        if not isinstance(self.depth, dict):
            return {}
        return {name: self.depth[name] for name in sorted(self.depth) if name != "default"}

    @property
    def depths(self) -> list[int | str]:
        """Every depth it names: the plain depth, or each class's."""
        return list(self.depth.values()) if isinstance(self.depth, dict) else [self.depth]

    @property
    def auto(self) -> bool:
        """Whether some depth is `auto` (the worker then takes `--draft-max-depth`)."""
        return DEPTH_AUTO in self.depths


def format_gib(value: float) -> str:
    """A GiB figure as the command line carries it: `2`, `0.5`, `1.25` (six significant digits, as Nix renders it)."""
    return format(value, "g")


class PrefixCacheSpec(StrictModel):
    max_gib: PrefixCacheGiB = Field(
        PREFIX_CACHE_GIB_DEFAULT,
        description=(
            "Memory the worker keeps for prompt snapshots that later requests resume from (GiB, least recently used "
            "out first); 0 turns the prefix cache off. Rendered as `--prefix-cache-gib`; mlx_lm.server has no byte budget."
        ),
    )
    disk_gib: PrefixCacheGiB = Field(PREFIX_CACHE_DISK_GIB_DEFAULT, description=(
        "Disk the prefix cache's disk tier may use in `dir` (GiB, least recently used out first); 0 turns the disk tier off. "
        "Rendered as `--prefix-cache-disk-gib` with a `dir`; native backend only."))
    dir: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description=(
            "Directory of the prefix cache's disk tier, which keeps snapshots across restarts; null: no disk tier "
            "(`mtpstack up` then uses `<run-dir>/prefix-cache/<worker>`; the NixOS and nix-darwin modules default it "
            "to the worker's state directory). Rendered as `--prefix-cache-dir`; native backend only."
        ),
    )


class DistributedSpec(StrictModel):
    hosts: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=2,
        description=(
            "The hosts (names under top-level `hosts`) the worker spans, one rank each, in rank order: the first runs "
            "rank 0 and serves HTTP at the worker's `host`/`port`. This is the worker's placement."
        ),
    )
    backend: DistributedBackend = Field(
        "ring",
        description="MLX's distributed backend: `ring` (TCP, Ethernet or Thunderbolt) or `jaccl` (RDMA over Thunderbolt, macOS only).",
    )
    strategy: ShardStrategy = Field(
        "tensor",
        description="`tensor`: every layer split across the ranks (mlx-lm's `shard`); `pipeline`: each rank a run of layers (`pipeline`).",
    )
    base_port: Port | None = Field(
        None,
        description=(
            f"Rank r listens for its peers at its host's address, port `basePort + r`; null: the worker's `port` + "
            f"{RANK_PORT_OFFSET} (or - {RANK_PORT_OFFSET} when that passes {PORT_MAX})."
        ),
    )
    ibv_devices: list[list[IbvDevices]] | None = Field(
        None,
        description=(
            "`jaccl` only, and required there: the RDMA devices that connect the ranks, one row per rank in `hosts` order, "
            "one entry per rank in each row: null for itself, else the device name (`rdma_en2`) or a list of names toward "
            "that rank. Rendered to the JSON file JACCL reads from `MLX_IBV_DEVICES`, which `mlx.launch` writes from the "
            "`rdma` lists of its hostfile; the group's size comes from it."
        ),
    )


class WorkerProfile(StrictModel):
    model: str = Field(min_length=1, description="Served model name: what clients put in `model`.")
    backend: Backend = Field("native", description="native (mtpstack's own engine) or mlx-lm (mlx_lm.server, for comparison).")
    target: TargetSpec
    drafter: DrafterSpec | None = Field(None, description="The drafter (an MTP head or a small model); null: no speculation.")
    max_num_seqs: Width = Field(description=f"The worker's batch width ({WIDTH_MIN}-{WIDTH_MAX}); must equal its model's proxy gate.")
    max_context_tokens: ContextTokens | None = Field(
        None,
        description=(
            "Longest context (prompt plus generated tokens) the worker accepts per request, at most the model's own "
            "maximum; null: the model's own maximum (`max_position_embeddings`). Native backend only."
        ),
    )
    prefix_cache: PrefixCacheSpec = Field(
        default_factory=PrefixCacheSpec,
        description="The worker's prefix cache: each turn of a conversation prefills only what is new.",
    )
    host: Host = Field(
        "127.0.0.1",
        description="Where the worker listens; the proxy dials it here, or at `hosts.<deployOn>.address` from another host.",
    )
    port: Port = Field(description="Port the worker listens on.")
    extra_args: list[str] = Field(default_factory=list, description="Passed through to the worker's command line.")
    deploy_on: DeployOn = Field(None, description=_DEPLOY_ON)
    distributed: DistributedSpec | None = Field(
        None,
        description="Span several hosts with MLX's distributed runtime (one rank per host); null: one process on one host.",
    )

    @property
    def home(self) -> str | None:
        """The host that runs the worker's HTTP side: `deployOn`, else a distributed worker's rank 0 host."""
        if self.deploy_on is None and self.distributed is not None:
            return self.distributed.hosts[0]
        return self.deploy_on

    @property
    def base_port(self) -> int | None:
        """Rank 0's port for its peers (rank r: this + r); None for a worker on one host."""
        d = self.distributed
        if d is None:
            return None
        if d.base_port is not None:
            return d.base_port
        up = self.port + RANK_PORT_OFFSET
        return up if up + len(d.hosts) - 1 <= PORT_MAX else self.port - RANK_PORT_OFFSET

    @property
    def bundled_head(self) -> bool:
        """The drafter is the MTP head in the target's own checkpoint: `drafter.path` is `target.path`."""
        return self.drafter is not None and self.drafter.path == self.target.path

    @property
    def declared_mtp(self) -> bool:
        """The config alone says the drafter is an MTP head (declared `mtp`, or bundled in the target)."""
        return self.drafter is not None and (self.drafter.kind == "mtp" or self.bundled_head)


class FleetConfig(StrictModel):
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    workers: dict[str, WorkerProfile] = Field(default_factory=dict, description="Worker profiles by name.")
    hosts: dict[str, HostConfig] = Field(
        default_factory=dict,
        description="The machines a placed fleet runs on, by host name (matched against each machine's own name).",
    )

    @property
    def models(self) -> list[str]:
        """Served model names, in first-seen order."""
        return list(dict.fromkeys(w.model for w in self.workers.values()))
