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
    configFile = "${configFile}";
    binDir = "${cfg.package}/bin";
    # No BLAS preload, unlike `mtpstack up` on Debian (whose PyPI mlx-cpu
    # bundles a slow reference BLAS): nixpkgs' `openblas` is ILP64 on
    # x86_64-linux under the same symbol names as the LP64 BLAS numpy links,
    # and nixpkgs' mlx links its BLAS itself. See docs/nix.md.
    inherit hardening;
    inherit (cfg) hostName;
    workerHardening = {
      MemoryDenyWriteExecute = false; # mlx compiles CPU kernels at run time and maps them executable
    };
  };

  firewall = mtpLib.firewall.rules {
    config = cfg.renderedConfig;
    inherit (cfg) hostName;
  };
  nftables = config.networking.nftables.enable or false;
in
{
  imports = [ ./options.nix ];

  config = lib.mkIf cfg.enable {
    systemd.services = units;

    networking.firewall = lib.mkIf cfg.openFirewall {
      allowedTCPPorts = firewall.allowedTCPPorts;
      # allowedTCPPorts cannot filter by source: the workers the proxy dials
      # from another host get rules that admit the proxy host only.
      extraInputRules = lib.mkIf nftables firewall.nftables;
      extraCommands = lib.mkIf (!nftables) firewall.iptables;
    };

    assertions = map (rule: {
      assertion = mtpLib.firewall.isIpLiteral rule.source;
      message =
        "`services.mtpstack.openFirewall` opens worker `${rule.worker}`'s port to the proxy host only, by its address,"
        + " but `services.mtpstack.hosts.${cfg.proxy.deployOn}.address` is `${rule.source}`, not an IP address (nftables rules take none)."
        + " Set it to the proxy host's IP address, or open the port yourself";
    }) (lib.optionals cfg.openFirewall firewall.sourceFiltered);
  };
}
