# A rendered config -> nix-darwin `launchd.daemons.<name>` values: one daemon
# per worker and one for the proxy. launchd takes the argument vector as a
# list and knows no systemd specifiers.
let
  argv = import ./argv.nix;
  placement = import ./placement.nix;
  distributed = import ./distributed.nix;
  systemd = import ./systemd.nix;
  proxyLib = import ./proxy.nix;

  # launchd applies "light resource limits, throttling CPU usage and I/O
  # bandwidth" to a job without ProcessType (nix-darwin
  # modules/launchd/launchd.nix, `ProcessType`). Workers decode for a client
  # that waits on every token and read tens of GB of weights at start; the
  # proxy relays those tokens. `Interactive` runs them "with the same resource
  # limitations as apps, that is to say, none"; `Adaptive` would follow XPC
  # transactions, which these HTTP servers never open, so it would leave them
  # throttled; `Standard` is the unset default.
  processType = "Interactive";

  label = name: "org.nixos.${name}";

  # launchd may start a daemon at boot before the volume holding /nix/store
  # is mounted: wait for it first, as nix-darwin's own `launchd.daemons.<name>.command`
  # does (modules/launchd/default.nix: `/bin/wait4path /nix/store && exec ...`).
  # The argument vector follows as `$@` ($0 is `name`), so it needs no quoting
  # and is the process's own command line after `exec`.
  waitForStore = name: programArguments: [
    "/bin/sh"
    "-c"
    "/bin/wait4path /nix/store && exec \"$@\""
    name
  ]
  ++ programArguments;

  # Arguments:
  #   config      the rendered config (render.nix)
  #   configFile  the path the proxy reads the config from (the modules give
  #               proxy.nix's `configPath`, which stays put between generations)
  #   binDir      where `mtpstack` and `mlx_lm.server` live
  #   stateDir    the model cache
  #   logDir      where stdout and stderr go
  #   user/group  the account the daemons run as
  #   hostName    only the parts placed on this host (placement.nix); null: all
  daemons =
    {
      config,
      configFile,
      binDir,
      stateDir ? (import ./defaults.nix).stateDir,
      logDir ? "/var/log/mtpstack",
      user ? "_mtpstack",
      group ? "_mtpstack",
      hostName ? null,
      writeText ? builtins.toFile,
    }:
    let
      parts = placement.partsOn config hostName;
      daemon = name: programArguments: extraEnvironment: {
        serviceConfig = {
          Label = label name;
          ProgramArguments = waitForStore name programArguments;
          KeepAlive = true;
          RunAtLoad = true;
          ProcessType = processType;
          StandardOutPath = "${logDir}/${name}.log";
          StandardErrorPath = "${logDir}/${name}.log";
          WorkingDirectory = stateDir;
          EnvironmentVariables = {
            HF_HOME = "${stateDir}/huggingface";
            HF_HUB_CACHE = "${stateDir}/huggingface/hub";
            PYTHONUNBUFFERED = "1";
          }
          // extraEnvironment;
          UserName = user;
          GroupName = group;
        };
      };
      # A distributed worker: one daemon per rank here (KeepAlive brings back
      # a rank that exited on losing a peer), named as the systemd units.
      worker =
        name: w: rank:
        let
          unit = systemd.rankUnit name rank;
        in
        {
          name = unit;
          value = daemon unit (argv.resolve binDir (argv.workerArgv w)) (
            if rank == null then { } else distributed.environment { inherit config name rank writeText; }
          );
        };
    in
    builtins.listToAttrs (
      builtins.concatMap (
        name: map (worker name config.workers.${name}) (systemd.ranksHere config.workers.${name} hostName)
      ) parts.workers
    )
    // (
      if parts.proxy then
        {
          mtpstack-proxy =
            let
              # nix-darwin reloads a daemon when its plist changes (modules/system/launchd.nix
              # `diff`s each one) and launchd has no restart triggers: the plist carries the
              # hash of what the proxy acts on (proxy.nix's `view`), while the file it reads
              # keeps its path between generations.
              d = daemon "mtpstack-proxy" (argv.resolve binDir (argv.proxyArgv configFile)) {
                MTPSTACK_PROXY_VIEW_SHA256 = builtins.hashString "sha256" (builtins.toJSON (proxyLib.view config));
              };
            in
            d
            // {
              serviceConfig = d.serviceConfig // {
                # launchd sends SIGKILL this long after SIGTERM (20 s unless set,
                # nix-darwin modules/launchd/launchd.nix `ExitTimeOut`): the
                # in-flight requests' grace comes first, as TimeoutStopSec on NixOS.
                ExitTimeOut = proxyLib.stopTimeoutSeconds config;
              };
            };
        }
      else
        { }
    );
in
{
  inherit
    label
    waitForStore
    processType
    daemons
    ;
}
