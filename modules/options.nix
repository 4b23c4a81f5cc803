# `services.mtpstack`, shared by the NixOS and the nix-darwin module. Names
# and meanings are those of the config file (validator/config.py); defaults
# come from ./lib/defaults.nix, which `render` fills in as well. The rendered
# config and the coupling assertions are platform-independent, so they live
# here too; ./nixos.nix and ./darwin.nix only turn them into units.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption types literalExpression;
  cfg = config.services.mtpstack;
  prefix = [ "services" "mtpstack" ];
  mtpLib = import ./lib;
  optionPath = import ./lib/option-path.nix;
  defaults = import ./lib/defaults.nix;
  width = types.ints.between defaults.widthMin defaults.widthMax;
  # nixpkgs before 25.05 lacks externalPath: fall back to a string.
  externalPath = types.externalPath or types.str;
  # A tenant's limit (proxy.tenants.<name>): a positive count, or null for none.
  limit =
    name: example: description:
    mkOption {
      type = types.nullOr types.ints.positive;
      default = defaults.tenant.${name};
      inherit example description;
    };
  pins = import ./pins.nix;
  # The workers with a `jaccl` rank on this machine: its package must carry
  # MLX's JACCL, which only the macOS 26 Metal wheels have (modules/pins.nix).
  jacclHere = mtpLib.distributed.jacclWorkersOn cfg.renderedConfig cfg.hostName;
  jacclVariant = lib.findFirst (v: pins.mlx-metal.wheels.${v}.jaccl) null (
    builtins.attrNames pins.mlx-metal.wheels
  );
in
{
  options.services.mtpstack = {
    enable = lib.mkEnableOption "mtpstack, MLX model workers with MTP speculative decoding behind an admission proxy";

    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ./package.nix (
        lib.optionalAttrs (jacclHere != [ ]) { macosVariant = jacclVariant; }
      );
      defaultText = literalExpression ''pkgs.callPackage ./modules/package.nix { } # { macosVariant = "26"; } on a host that runs a `jaccl` rank'';
      description = ''
        The mtpstack package: provides `mtpstack` (proxy, workers, validator)
        and `mlx_lm.server`. On aarch64-darwin it must carry the Metal build of
        mlx (the default does), and on a Mac that runs a `jaccl` rank the
        macOS 26 build, the only one with MLX's JACCL backend (the default
        takes it there; it needs macOS 26.2 or later).
      '';
    };

    hostName = mkOption {
      type = types.nullOr types.nonEmptyStr;
      default =
        let
          n = config.networking;
        in
        if (n.hostName or null) != null && n.hostName != "" then n.hostName else n.localHostName or null;
      defaultText = literalExpression "config.networking.hostName (nix-darwin: else config.networking.localHostName)";
      example = "mac1";
      description = ''
        This machine's name among `hosts`: it starts only the parts whose
        `deployOn` is this name or null. Needed once anything is placed.
      '';
    };

    hosts = mkOption {
      type = types.attrsOf (types.submodule ./host-options.nix);
      default = { };
      example = literalExpression ''
        {
          gateway.address = "10.0.0.1";
          mac1.address = "10.0.0.11";
        }
      '';
      description = ''
        The machines of a placed fleet, by host name. Declare the same fleet
        (workers, proxy, hosts) on every host; each runs its own part.
      '';
    };

    proxy = {
      deployOn = mkOption {
        type = types.nullOr types.nonEmptyStr;
        default = defaults.proxy.deployOn;
        example = "gateway";
        description = ''
          The host (a name under `hosts`) that runs the proxy; `null`: every
          host that imports this. Once any worker is placed, the proxy must be
          placed on exactly one host.
        '';
      };
      host = mkOption {
        type = types.nonEmptyStr;
        default = defaults.proxy.host;
        example = "0.0.0.0";
        description = "Address the proxy listens on.";
      };
      port = mkOption {
        type = types.port;
        default = defaults.proxy.port;
        example = 8080;
        description = "Port the proxy listens on.";
      };
      concurrencyLimit = mkOption {
        type = width;
        default = defaults.proxy.concurrencyLimit;
        example = 2;
        description = ''
          Admission gate (${toString defaults.widthMin}-${toString defaults.widthMax}) per worker for any model not in
          `modelConcurrencyLimits`. It must equal those workers'
          `maxNumSeqs`: change the two together.
        '';
      };
      modelConcurrencyLimits = mkOption {
        type = types.attrsOf width;
        default = defaults.proxy.modelConcurrencyLimits;
        example = {
          "qwen3.8-27b" = 2;
        };
        description = ''
          Served model name -> admission gate (${toString defaults.widthMin}-${toString defaults.widthMax}) per worker of that model.
          Each must equal those workers' `maxNumSeqs`: change the two
          together.
        '';
      };
      queue = {
        maxWaiting = mkOption {
          type = types.ints.unsigned;
          default = defaults.proxy.queue.maxWaiting;
          example = 32;
          description = "Requests that may wait per model when every gate is full; beyond it: 429 `queue_full`.";
        };
        timeoutSeconds = mkOption {
          type = types.numbers.positive;
          default = defaults.proxy.queue.timeoutSeconds;
          example = 10;
          description = "How long a request may wait for a slot before 429 `queue_timeout`.";
        };
      };
      routing = mkOption {
        type = types.enum defaults.routings;
        default = defaults.proxy.routing;
        example = "first-free";
        description = ''
          Which worker with a free slot a request goes to: `affinity`, the one
          that served its conversation (`prompt_cache_key`, else `user`, else
          the prompt's beginning), where its prefix is cached; `first-free`,
          the least loaded. Neither makes a request wait while any worker of
          its model has a free slot, unless `affinityWaitSeconds` is set.
        '';
      };
      timeouts = {
        connectSeconds = mkOption {
          type = types.numbers.positive;
          default = defaults.proxy.timeouts.connectSeconds;
          example = 2;
          description = "Time to open a connection to a worker before 504.";
        };
        firstByteSeconds = mkOption {
          type = types.numbers.positive;
          default = defaults.proxy.timeouts.firstByteSeconds;
          example = 600;
          description = ''
            Time to the first byte of the worker's answer; a non-streamed
            answer's first byte comes when generation ends.
          '';
        };
        idleSeconds = mkOption {
          type = types.numbers.positive;
          default = defaults.proxy.timeouts.idleSeconds;
          example = 120;
          description = "Longest pause between two chunks of a streamed answer before 504.";
        };
        clientSeconds = mkOption {
          type = types.numbers.positive;
          default = defaults.proxy.timeouts.clientSeconds;
          example = 10;
          description = ''
            Deadline for a client to send a whole request (head and body),
            counted from the connection's opening or the previous answer's end;
            a late body gets 408, a late head has its connection closed.
          '';
        };
      };
      affinityWaitSeconds = mkOption {
        type = types.numbers.nonnegative;
        default = defaults.proxy.affinityWaitSeconds;
        example = 5;
        description = ''
          Under `affinity` routing, how long a request whose worker (the one
          holding its conversation's prefix) is full may wait for a slot
          there while another worker is free, before it goes to that one and
          prefills its prompt again; at most half of `queue.timeoutSeconds`
          is waited. 0: never wait.
        '';
      };
      maxBodyBytes = mkOption {
        type = types.ints.positive;
        default = defaults.proxy.maxBodyBytes;
        example = 4194304;
        description = "Largest request body accepted; larger: 413 `body_too_large`.";
      };
      shutdownGraceSeconds = mkOption {
        type = types.numbers.nonnegative;
        default = defaults.proxy.shutdownGraceSeconds;
        example = 60;
        description = "How long in-flight requests may finish after a stop signal.";
      };
      apiKeysFile = mkOption {
        type = types.nullOr externalPath;
        default = defaults.proxy.apiKeysFile;
        example = "/run/secrets/mtpstack-api-keys";
        description = ''
          File of accepted API keys, outside the Nix store (a string, so it is
          never copied there): one `NAME KEY` line per key (a key alone is
          tenant `default`); `null`: no authentication. On NixOS a privileged
          step of the proxy unit copies it, at start and on `systemctl reload`,
          where only the unit's user can read it; nix-darwin's daemon reads it
          in place (it must be readable by `_mtpstack`).
        '';
      };
      tenants = mkOption {
        type = types.attrsOf (
          types.submodule {
            options = {
              maxConcurrent = limit "maxConcurrent" 4 "Requests of this tenant in flight (waiting or admitted) across the fleet at once; beyond: 429. `null`: unlimited.";
              tokensPerMinute = limit "tokensPerMinute" 200000 "Prompt tokens not served from a prefix cache plus completion tokens, per sliding minute; beyond: 429. `null`: unlimited.";
              requestsPerMinute = limit "requestsPerMinute" 60 "Requests per sliding minute; beyond: 429. `null`: unlimited.";
              weight = mkOption {
                type = types.ints.between 1 1000;
                default = defaults.tenant.weight;
                example = 2;
                description = "Share of a gate when several tenants wait on it: slots go round-robin by weight, first come first served within a tenant.";
              };
            };
          }
        );
        default = defaults.proxy.tenants;
        example = literalExpression ''{ alice = { maxConcurrent = 2; weight = 2; }; ci.requestsPerMinute = 30; }'';
        description = ''
          Limits and queue weight per tenant, a name in `apiKeysFile`; a tenant
          not listed is unlimited with weight 1. A change reloads the proxy
          (`systemctl reload`, SIGHUP) instead of restarting it.
        '';
      };
      fairQueueing = mkOption {
        type = types.bool;
        default = defaults.proxy.fairQueueing;
        example = false;
        description = ''
          When several tenants wait for one model, serve them round-robin by
          `weight`; `false`: one first-come line per model.
        '';
      };
    };

    policy.allowedBackends = mkOption {
      type = types.listOf (types.enum defaults.backends);
      default = defaults.policy.allowedBackends;
      example = [ "native" "mlx-lm" ];
      description = "Backends this fleet may run: `native` | `mlx-lm`.";
    };

    workers = mkOption {
      type = types.attrsOf (types.submodule ./worker-options.nix);
      default = { };
      example = literalExpression ''
        {
          qwen-mtp = {
            model = "qwen3.8-27b";
            target = { path = "mlx-community/Qwen3.8-27B-4bit"; bits = 4; };
            drafter = { path = "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX"; bits = 6; depth = 3; };
            maxNumSeqs = 2;
            port = 8101;
          };
        }
      '';
      description = "Worker profiles by name; each runs as its own service.";
    };

    checkConfig = mkOption {
      type = types.bool;
      default = true;
      example = false;
      description = ''
        Run `mtpstack validate` on the rendered config file at build time, so
        a bad fleet fails the build with the validator's own message.
      '';
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      example = true;
      description = ''
        NixOS: open the proxy's port on the host that runs the proxy, and the
        port of each worker placed here while the proxy runs elsewhere, to the
        proxy host's `hosts.<name>.address` only (rules for the
        `networking.firewall.backend` in use, nftables or iptables, filtered
        by source; under firewalld a warning). nix-darwin has no port
        firewall, so this restricts nothing there: bind workers to the host's
        own address, or use pf (docs/nix.md, Firewall).
      '';
    };

    renderedConfig = mkOption {
      type = types.attrs;
      internal = true;
      readOnly = true;
      description = "The config file's contents, as rendered from these options.";
    };
  };

  config = {
    services.mtpstack.renderedConfig = mtpLib.render {
      inherit (cfg) proxy policy workers hosts;
    };
    assertions = lib.mkIf cfg.enable (
      mtpLib.assertions prefix cfg.renderedConfig
      ++ [
        {
          # A name that is not among the hosts would start no placed part, silently.
          assertion =
            !mtpLib.placement.isPlaced cfg.renderedConfig
            || (cfg.hostName != null && cfg.hosts ? ${cfg.hostName});
          message =
            "this fleet is placed on hosts, but this machine's name `${optionPath [ "services" "mtpstack" "hostName" ]}` is "
            + (if cfg.hostName == null then "null" else "`${cfg.hostName}`")
            + ", which is not declared in `${optionPath (prefix ++ [ "hosts" ])}` (declared: ${
              lib.concatMapStringsSep ", " (h: "`${h}`") (builtins.attrNames cfg.hosts)
            }). Set `networking.hostName` or `${optionPath (prefix ++ [ "hostName" ])}` to one of them";
        }
      ]
    );
    warnings = lib.mkIf cfg.enable (map (w: w.message) (mtpLib.placement.warnings prefix cfg.renderedConfig));
  };
}
