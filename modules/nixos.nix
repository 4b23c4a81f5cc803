# NixOS: one systemd service per worker and one for the proxy, rendered by
# ./lib from `services.mtpstack`.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.mtpstack;
  mtpLib = import ./lib;

  configFile = import ./config-file.nix {
    inherit pkgs cfg;
    contents = mtpLib.systemd.runtimeConfig cfg.renderedConfig;
  };

  hardening = {
    CapabilityBoundingSet = [ "" ];
    DevicePolicy = "closed";
    LockPersonality = true;
    MemoryDenyWriteExecute = true;
    NoNewPrivileges = true;
    PrivateDevices = true;
    PrivateMounts = true;
    PrivateTmp = true;
    PrivateUsers = true;
    ProtectClock = true;
    ProtectControlGroups = true;
    ProtectHome = true;
    ProtectHostname = true;
    ProtectKernelLogs = true;
    ProtectKernelModules = true;
    ProtectKernelTunables = true;
    ProtectProc = "invisible";
    ProtectSystem = "strict";
    RemoveIPC = true;
    RestrictAddressFamilies = [ "AF_INET" "AF_INET6" "AF_UNIX" ];
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    SystemCallArchitectures = "native";
    SystemCallFilter = [ "@system-service" "~@privileged" ];
    UMask = "0077";
  };

  units = mtpLib.systemd.units {
    config = cfg.renderedConfig;
    # The proxy reads the fleet at a path that outlives generations, so an
    # edit it does not act on leaves it running (lib/proxy.nix).
    configFile = mtpLib.proxy.configPath;
    binDir = "${cfg.package}/bin";
    # No BLAS preload, unlike `mtpstack up` on Debian (whose PyPI mlx-cpu
    # bundles a slow reference BLAS): nixpkgs' `openblas` is ILP64 on
    # x86_64-linux under the same symbol names as the LP64 BLAS numpy links,
    # and nixpkgs' mlx links its BLAS itself. See docs/nix.md.
    inherit hardening;
    inherit (cfg) hostName;
    inherit (pkgs) writeText;
    shell = pkgs.runtimeShell;
    coreutilsBin = "${pkgs.coreutils}/bin";
    workerHardening = {
      MemoryDenyWriteExecute = false; # mlx compiles CPU kernels at run time and maps them executable
    };
  };

  firewall = mtpLib.firewall.rules {
    config = cfg.renderedConfig;
    inherit (cfg) hostName;
  };
  # nixpkgs' `networking.firewall.backend` (firewalld, else nftables, else
  # iptables); an evaluation without nixpkgs' firewall module (or a nixpkgs
  # older than that option) falls back to the choice it replaced.
  firewallBackend =
    config.networking.firewall.backend
      or (if config.networking.nftables.enable or false then "nftables" else "iptables");
  show = name: "`services.mtpstack.${name}`";
  familyName = f: if f == "ip6" then "IPv6" else "IPv4";
in
{
  imports = [ ./options.nix ];

  config = lib.mkIf cfg.enable {
    systemd.services = units;

    # The checked fleet file (built only if `mtpstack validate` accepts it,
    # with checkConfig): what the proxy reads, and what `mtpstack validate`,
    # `status` and `weights` can be pointed at on the host.
    environment.etc.${mtpLib.proxy.etcName}.source = configFile;

    networking.firewall = lib.mkIf cfg.openFirewall {
      allowedTCPPorts = firewall.allowedTCPPorts;
      # allowedTCPPorts cannot filter by source: the workers the proxy dials
      # from another host get rules that admit the proxy host only.
      extraInputRules = lib.mkIf (firewallBackend == "nftables") firewall.nftables;
      extraCommands = lib.mkIf (firewallBackend == "iptables") firewall.iptables;
    };

    warnings = lib.optional (
      cfg.openFirewall && firewallBackend == "firewalld" && firewall.sourceFiltered != [ ]
    ) "`services.mtpstack.openFirewall` cannot admit the proxy host to ${
      lib.concatMapStringsSep ", " (r: "worker `${r.worker}`'s port ${toString r.port}") firewall.sourceFiltered
    } under firewalld (`networking.firewall.backend` is `firewalld`, which reads neither `extraInputRules` nor `extraCommands`), so they stay closed. Add a firewalld rich rule admitting the proxy host's address to them, or use the nftables or iptables backend";

    assertions =
      # MLX builds JACCL for macOS only (mlx/distributed/jaccl/CMakeLists.txt).
      map (name: {
        assertion = false;
        message =
          "worker `${name}` runs a rank on this host with ${show "workers.${name}.distributed.backend"} `jaccl`, which runs on macOS only"
          + " (MLX builds its JACCL backend, RDMA over Thunderbolt, for macOS 26.2 and later). Use backend `ring` for a worker with ranks on Linux hosts";
      }) (mtpLib.distributed.jacclWorkersOn cfg.renderedConfig cfg.hostName)
      ++ lib.optionals cfg.openFirewall (
      lib.concatMap (
        rule:
        let
          sourceFamily = mtpLib.firewall.family rule.source;
        in
        [
          {
            assertion = sourceFamily != null;
            message =
              "${show "openFirewall"} opens worker `${rule.worker}`'s port to the proxy host only, by its address,"
              + " but ${show "hosts.${rule.proxyHost}.address"} is `${rule.source}`, not an IP address (nftables rules take none)."
              + " Set it to the proxy host's IP address, or open the port yourself";
          }
          {
            assertion = sourceFamily == null || rule.family == sourceFamily;
            message =
              "${show "openFirewall"} would admit ${show "hosts.${rule.proxyHost}.address"} `${rule.source}` (${familyName sourceFamily}) to worker `${rule.worker}`'s port,"
              + " but the proxy dials that worker at `${rule.dialled}` (${familyName rule.family}), so it connects from an ${familyName rule.family} address and the rule would never match."
              + " Give both hosts addresses of one family in ${show "hosts"}, or open the port yourself";
          }
        ]
      ) firewall.sourceFiltered
    );
  };
}
