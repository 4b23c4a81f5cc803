# One worker profile: `services.mtpstack.workers.<name>`. Names and meanings
# are those of the config file's `workers.<name>` (validator/config.py).
{
  name,
  config,
  lib,
  ...
}:
let
  inherit (lib) mkOption types literalExpression;
  defaults = import ./lib/defaults.nix;
  bits = types.enum defaults.bits;
  # A budget in GiB, memory or disk.
  gib = types.addCheck types.number (n: n >= 0 && n <= defaults.prefixCacheGiBMax) // {
    description = "number between 0 and ${toString defaults.prefixCacheGiBMax} (GiB)";
  };
  # nixpkgs before 25.05 lacks externalPath: fall back to a string.
  externalPath = types.externalPath or types.str;
in
{
  options = {
    model = mkOption {
      type = types.nonEmptyStr;
      default = name;
      defaultText = literalExpression "<name>";
      example = "qwen3.8-27b";
      description = ''
        Served model name: what clients put in `model`. The proxy's gate for
        this model is `proxy.modelConcurrencyLimits.<model>`, else
        `proxy.concurrencyLimit`.
      '';
    };

    backend = mkOption {
      type = types.enum defaults.backends;
      default = defaults.worker.backend;
      example = "mlx-lm";
      description = ''
        `native` (mtpstack's own engine) or `mlx-lm` (`mlx_lm.server`, for
        comparison). Must be listed in `policy.allowedBackends`.
      '';
    };

    target = {
      path = mkOption {
        type = types.nonEmptyStr;
        example = "mlx-community/Qwen3.8-27B-4bit";
        description = ''
          Local directory or hub id of the target model. It is on the worker's
          command line, so the running process shows which weights it loaded.
        '';
      };
      bits = mkOption {
        type = bits;
        example = 4;
        description = "Quantization of the target: 2, 3, 4, 5, 6, 8, `mxfp4`, `bf16`, `fp16` or `fp32`.";
      };
    };

    drafter = mkOption {
      type = types.nullOr (
        types.submodule {
          options = {
            path = mkOption {
              type = types.nonEmptyStr;
              example = "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX";
              description = ''
                Local directory or hub id of the drafter: an MTP head, a small
                model trained with the target, or the target's own path for an
                MTP head bundled in its checkpoint (`mtp.*` tensors).
              '';
            };
            bits = mkOption {
              type = bits;
              example = 6;
              description = "Quantization of the drafter; keep it at 6 bits or above the target's.";
            };
            depth = mkOption {
              type =
                let
                  depth = types.ints.between defaults.depthMin defaults.depthMax;
                  one = types.either depth (types.enum [ "auto" ]);
                in
                types.either one (types.attrsOf one);
              example = literalExpression "{ code = 4; prose = \"auto\"; default = 3; }";
              description = ''
                Draft depth: tokens the drafter proposes per verification
                step (${toString defaults.depthMin}-${toString defaults.depthMax}), or `"auto"`: each step as
                deep as the rows' live acceptance pays for, 0 included, up to
                `maxDepth`; or a depth per workload class, with `default`
                required for requests of no listed class. A request names its
                class in `mtpstack_class` or `X-Mtpstack-Class`, else the
                worker classifies its prompt (`code` or `prose`). Backend
                `mlx-lm` takes a single number only.
              '';
            };
            maxDepth = mkOption {
              type = types.ints.between defaults.depthMin defaults.depthMax;
              default = defaults.drafter.maxDepth;
              example = 6;
              description = "The deepest an `auto` depth drafts; the head is loaded for it. Unused without `auto`.";
            };
            kind = mkOption {
              type = types.enum defaults.drafterKinds;
              default = defaults.drafter.kind;
              example = "mtp";
              description = ''
                What the drafter is: `mtp` (a head drafting from the target's
                hidden state) or `model` (a separate small language model);
                `auto`: detected from the drafter's config and tensors.
                `mlx_lm.server` loads only `model` drafters.
              '';
            };
          };
        }
      );
      default = defaults.worker.drafter;
      example = literalExpression ''
        {
          path = "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX";
          bits = 6;
          depth = 3;
        }
      '';
      description = "The drafter (an MTP head or a small model); `null`: no speculation.";
    };

    maxNumSeqs = mkOption {
      type = types.ints.between defaults.widthMin defaults.widthMax;
      example = 2;
      description = ''
        The worker's batch width (${toString defaults.widthMin}-${toString defaults.widthMax}). It must equal the proxy's gate for
        this worker's model (`proxy.modelConcurrencyLimits.<model>`, else
        `proxy.concurrencyLimit`): change the two together. Any matched pair
        is valid, with or without a drafter.
      '';
    };

    maxContextTokens = mkOption {
      type = types.nullOr types.ints.positive;
      default = defaults.worker.maxContextTokens;
      example = 32768;
      description = ''
        The longest context (prompt plus generated tokens) the worker accepts
        per request; longer requests get 400 `context_length_exceeded`.
        `null`: the model's own maximum (`max_position_embeddings`). It may
        not exceed that maximum (`mtpstack validate --deep` checks it), and
        backend `mlx-lm` cannot enforce it (refused:
        `mlx-lm-cannot-cap-context`).
      '';
    };

    prefixCache.maxGiB = mkOption {
      type = gib;
      default = defaults.worker.prefixCache.maxGiB;
      example = 8;
      description = ''
        Memory the worker keeps for prompt snapshots that later requests
        resume from, so each turn of an agent's conversation prefills only
        what is new (least recently used out first); `0` turns the prefix
        cache off. Passed as `--prefix-cache-gib`; with backend `mlx-lm` it
        becomes `--prompt-cache-bytes` (off with a drafter). Counted by
        `mtpstack validate --deep` in the host's memory budget.
      '';
    };

    prefixCache.dir = mkOption {
      type = types.nullOr externalPath;
      default =
        if config.backend == "native" then "${defaults.stateDir}/workers/${name}/prefix-cache" else null;
      defaultText = literalExpression ''
        if backend == "native" then "${defaults.stateDir}/workers/<name>/prefix-cache" else null
      '';
      example = "/srv/mtpstack/prefix-cache";
      description = ''
        Directory of the prefix cache's disk tier: snapshots evicted from
        memory go there, and a restarted worker resumes conversations from
        it. `null`: no disk tier (the config file's default). The default
        is a folder in the worker's state directory, which the NixOS unit
        gets as a systemd `StateDirectory` and nix-darwin's activation
        creates for the daemons' user; a directory outside
        `${defaults.stateDir}` must be writable by that user (NixOS: the
        unit's `DynamicUser`, so prefer one under `${defaults.stateDir}`).
        Two workers on one host must not share one. Passed as
        `--prefix-cache-dir`; backend `mlx-lm` has no disk tier.
      '';
    };

    prefixCache.diskGiB = mkOption {
      type = gib;
      default = defaults.worker.prefixCache.diskGiB;
      example = 128;
      description = ''
        Disk the prefix cache's disk tier may use in `prefixCache.dir`
        (least recently used out first); `0` turns the disk tier off.
        Passed as `--prefix-cache-disk-gib` with a `prefixCache.dir`.
      '';
    };

    host = mkOption {
      type = types.nonEmptyStr;
      default = defaults.worker.host;
      example = "0.0.0.0";
      description = ''
        Where the worker listens. The proxy dials it here, or at
        `hosts.<deployOn>.address` when it runs on another host (then it must
        not listen on loopback only).
      '';
    };

    deployOn = mkOption {
      type = types.nullOr types.nonEmptyStr;
      default = defaults.worker.deployOn;
      example = "mac1";
      description = ''
        The host (a name under `services.mtpstack.hosts`) that runs this
        worker; `null`: every host that imports this.
      '';
    };

    port = mkOption {
      type = types.port;
      example = 8101;
      description = "Port the worker listens on.";
    };

    distributed = mkOption {
      type = types.nullOr (
        types.submodule {
          options = {
            hosts = mkOption {
              type = types.addCheck (types.listOf types.nonEmptyStr) (l: builtins.length l >= 2) // {
                description = "list of at least two host names";
              };
              example = [ "mac1" "mac2" ];
              description = ''
                The hosts (names under `services.mtpstack.hosts`) the worker
                spans, one rank each, in rank order. The first runs rank 0 and
                serves HTTP at the worker's `host`/`port`; this list is the
                worker's placement (`deployOn` may only repeat its first host).
              '';
            };
            backend = mkOption {
              type = types.enum defaults.distributedBackends;
              default = defaults.distributed.backend;
              example = "jaccl";
              description = ''
                MLX's distributed backend: `ring` (TCP over Ethernet or
                Thunderbolt; every host needs an IPv4 address) or `jaccl` (RDMA
                over Thunderbolt 5, macOS 26.2 and later; needs `ibvDevices`, and
                rank 0's host an IPv4 address). A host running a `jaccl` rank
                gets the macOS 26 build of MLX's Metal wheels, the only one
                with JACCL.
              '';
            };
            strategy = mkOption {
              type = types.enum defaults.shardStrategies;
              default = defaults.distributed.strategy;
              example = "pipeline";
              description = ''
                `tensor`: every layer split across the ranks (mlx-lm's
                `shard`); `pipeline`: each rank runs a run of whole layers
                (mlx-lm's `pipeline`).
              '';
            };
            basePort = mkOption {
              type = types.nullOr types.port;
              default = defaults.distributed.basePort;
              example = 18101;
              description = ''
                Rank r listens for its peers at its host's address, port
                `basePort + r`. `null`: the worker's `port` + ${toString defaults.rankPortOffset}
                (or - ${toString defaults.rankPortOffset} when that passes ${toString defaults.portMax}).
              '';
            };
            ibvDevices = mkOption {
              type = types.nullOr (
                types.listOf (
                  types.listOf (types.nullOr (types.either types.nonEmptyStr (types.listOf types.nonEmptyStr)))
                )
              );
              default = defaults.distributed.ibvDevices;
              example = literalExpression ''
                [
                  [ null "rdma_en2" ]
                  [ "rdma_en2" null ]
                ]
              '';
              description = ''
                `jaccl` only, and required there: the RDMA devices that
                connect the ranks, one row per rank in `hosts` order, each with
                one entry per rank: `null` for the rank itself, else the device
                name toward that rank (or a list of names). Rendered into the
                store as the JSON file JACCL reads from `MLX_IBV_DEVICES` (what
                `mlx.launch` writes from its hostfile's `rdma` lists); the
                group's size comes from it. `ibv_devices` on each Mac lists
                its devices.
              '';
            };
          };
        }
      );
      default = defaults.worker.distributed;
      example = literalExpression ''{ hosts = [ "mac1" "mac2" ]; strategy = "pipeline"; }'';
      description = ''
        Span several hosts with MLX's distributed runtime, one rank per host;
        `null`: one process on one host. Each listed host runs a unit for
        its rank; a rank that loses a peer exits, so the service manager
        restarts the worker as one.
      '';
    };

    extraArgs = mkOption {
      type = types.listOf types.str;
      default = defaults.worker.extraArgs;
      example = [ "--log-level" "debug" ];
      description = "Passed through to the end of the worker's command line.";
    };
  };
}
