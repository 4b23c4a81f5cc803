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

  # The same preload `mtpstack up` applies: an mlx whose matmuls go to a
  # reference BLAS runs them ~40x slower than with OpenBLAS. Not on an
  # accelerator.
  preload = if pkgs.config.cudaSupport or false then null else "${pkgs.openblas}/lib/libopenblas.so";

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
    inherit preload hardening;
    workerHardening = {
      MemoryDenyWriteExecute = false; # mlx compiles CPU kernels at run time and maps them executable
    };
  };
in
{
  imports = [ ./options.nix ];

  config = lib.mkIf cfg.enable {
    systemd.services = units;

    networking.firewall.allowedTCPPorts = lib.optional cfg.openFirewall cfg.proxy.port;
  };
}
