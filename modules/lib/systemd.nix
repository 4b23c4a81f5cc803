# A rendered config -> systemd unit descriptions (the shape of NixOS'
# `systemd.services.<name>`): one unit per worker and one for the proxy.
let
  argv = import ./argv.nix;
  placement = import ./placement.nix;
  distributed = import ./distributed.nix;
  proxyLib = import ./proxy.nix;

  # systemd splits ExecStart= like a shell but with C-style escapes and
  # expands `%` specifiers and `$` variables: quote every argument as a JSON
  # string (systemd understands its escapes) and double `%` and `$`.
  escapeExecArg =
    arg: builtins.replaceStrings [ "%" "$" ] [ "%%" "$$" ] (builtins.toJSON (toString arg));
  escapeExecArgs = args: builtins.concatStringsSep " " (map escapeExecArg args);

  workerUnit = name: "mtpstack-worker-${name}";
  # Rank 0 of a distributed worker is its HTTP side and keeps the worker's unit
  # name; rank r > 0 runs as `mtpstack-worker-<name>-rank<r>`.
  rankUnit = name: rank: if rank == null || rank == 0 then workerUnit name else "${workerUnit name}-rank${toString rank}";

  # The ranks of worker `w` that run on `hostName` ([ null ]: a worker on one
  # host); every rank when `hostName` is null.
  ranksHere =
    w: hostName:
    if w.distributed == null then
      [ null ]
    else if hostName == null then
      builtins.genList (r: r) (builtins.length w.distributed.hosts)
    else
      [ (distributed.rankOn w hostName) ];
  proxyUnit = "mtpstack-proxy";

  # Where the proxy finds the API keys: a privileged step of its unit (`+`:
  # root, outside the unit's sandbox) copies the operator's file (outside the
  # store) into the unit's runtime directory, readable by the unit's dynamic
  # user alone, at start and again on `systemctl reload` before the proxy
  # re-reads it on SIGHUP. (A systemd credential is fixed for the unit's run:
  # new keys would need a restart.)
  proxyRuntimeDir = "/run/${proxyUnit}";
  apiKeysCredential = "${proxyRuntimeDir}/api-keys";

  # Copies the keys file ($1) into the runtime directory ($2) as `api-keys`,
  # owned by the directory's owner (the dynamic user), replacing the old copy
  # at once: the proxy never reads half a file.
  copyKeysScript = coreutilsBin: ''
    set -eu
    umask 077
    dir=$2
    ${coreutilsBin}/install -m 0400 -o "$(${coreutilsBin}/stat -c %u "$dir")" -g "$(${coreutilsBin}/stat -c %g "$dir")" -T -- "$1" "$dir/api-keys.new"
    ${coreutilsBin}/mv -f -T -- "$dir/api-keys.new" "$dir/api-keys"
  '';

  # The config as the proxy unit reads it: the API keys file is the copy's
  # path.
  runtimeConfig =
    config:
    if config.proxy.apiKeysFile == null then
      config
    else
      config // { proxy = config.proxy // { apiKeysFile = apiKeysCredential; }; };

  # A worker's prefix-cache directory: under /var/lib, a StateDirectory of
  # its unit (systemd makes it, owned by the unit's dynamic user, and keeps it
  # across restarts); elsewhere only made writable (the operator owns it).
  varLib = "/var/lib/";
  cacheDirConfig =
    common: w:
    let
      dir = w.prefixCache.dir;
    in
    if dir == null then
      { }
    else if builtins.substring 0 (builtins.stringLength varLib) dir == varLib then
      {
        StateDirectory = common.StateDirectory ++ [
          (builtins.substring (builtins.stringLength varLib) (builtins.stringLength dir) dir)
        ];
      }
    else
      { ReadWritePaths = [ "-${dir}" ]; };

  # Arguments:
  #   config      the rendered config (render.nix), as the operator wrote it
  #   configFile  the path the proxy reads the runtime config from (see
  #               runtimeConfig); the modules give proxy.nix's `configPath`,
  #               which stays put between generations
  #   binDir      where `mtpstack` and `mlx_lm.server` live
  #   stateDir    the model cache (the units' StateDirectory)
  #   hardening   serviceConfig shared by every unit
  #   workerHardening  serviceConfig that only the workers get (wins over hardening)
  #   hostName    only the parts placed on this host (placement.nix); null: all
  #   writeText   name -> text -> path, for a distributed worker's hostfile
  units =
    {
      config,
      configFile,
      binDir,
      stateDir ? (import ./defaults.nix).stateDir,
      hardening ? { },
      workerHardening ? { },
      hostName ? null,
      writeText ? builtins.toFile,
      # A shell and coreutils for the keys file's copy and the reload's signal.
      shell ? "/bin/sh",
      coreutilsBin ? "/usr/bin",
    }:
    let
      parts = placement.partsOn config hostName;
      common = {
        Type = "simple";
        Restart = "on-failure";
        RestartSec = 5;
        DynamicUser = true;
        # One name for every unit: they share the dynamic user and its cache.
        User = "mtpstack";
        Group = "mtpstack";
        StateDirectory = [
          "mtpstack"
          "mtpstack/huggingface"
          "mtpstack/huggingface/hub"
        ];
        WorkingDirectory = stateDir;
      } // hardening;
      environment = {
        HF_HOME = "${stateDir}/huggingface";
        HF_HUB_CACHE = "${stateDir}/huggingface/hub";
        PYTHONUNBUFFERED = "1";
      };
      worker =
        name: w: rank:
        let
          ranks = ranksHere w hostName;
          # Other ranks of this worker on this machine (every rank when
          # `hostName` is null): they start and stop with rank 0's unit.
          siblings = map (r: "${rankUnit name r}.service") (builtins.filter (r: r != rank && r != 0) ranks);
          leader = "${workerUnit name}.service";
          together =
            if rank == null || ranks == [ rank ] then
              { }
            else if rank == 0 then
              { wants = siblings; }
            else
              {
                bindsTo = [ leader ];
                partOf = [ leader ];
              };
        in
        {
          name = rankUnit name rank;
          value = {
            description =
              "mtpstack worker ${name} (model ${w.model}, batch width ${toString w.maxNumSeqs})"
              + (if rank == null then "" else ", rank ${toString rank} of ${toString (builtins.length w.distributed.hosts)}");
            wantedBy = [ "multi-user.target" ];
            after = [ "network.target" ];
            environment =
              environment
              // (if rank == null then { } else distributed.environment { inherit config name rank writeText; });
            # The worker reads its settings at start-up only: any change restarts
            # it (its argv and environment are its own profile's alone, so no
            # other worker's edit does).
            restartTriggers = [ (builtins.toJSON w) ];
            serviceConfig = common // workerHardening // cacheDirConfig common w // {
              ExecStart = escapeExecArgs (argv.resolve binDir (argv.workerArgv w));
            } // (
              # A rank exits when it loses a peer; each host's unit comes back
              # and the ranks meet again (no start limit: peers may take a while).
              if rank == null then { } else { Restart = "always"; }
            );
          } // (if rank == null then { } else { unitConfig.StartLimitIntervalSec = 0; })
          // together;
        };
      workerUnitList = builtins.concatMap (
        name: map (worker name config.workers.${name}) (ranksHere config.workers.${name} hostName)
      ) parts.workers;
      # Only the workers on this host: the others are dialled over the network.
      workerUnits = map (u: "${u.name}.service") workerUnitList;
      proxy = {
        description = "mtpstack admission proxy";
        wantedBy = [ "multi-user.target" ];
        after = [ "network.target" ] ++ workerUnits;
        wants = workerUnits;
        inherit environment;
        # The proxy reads `configFile`, whose path does not change: it restarts
        # when what it acts on does (proxy.nix's `view`), not on every edit.
        restartTriggers = [ (builtins.toJSON (proxyLib.view config)) ];
        serviceConfig =
          common
          // {
            ExecStart = escapeExecArgs (argv.resolve binDir (argv.proxyArgv configFile));
            TimeoutStopSec = proxyLib.stopTimeoutSeconds config;
          }
          // {
            # SIGHUP: the proxy re-reads its keys and tenants (docs/proxy.md).
            ExecReload = copyKeys ++ [ "${coreutilsBin}/kill -HUP $MAINPID" ];
          }
          // (
            if config.proxy.apiKeysFile == null then
              { }
            else
              {
                RuntimeDirectory = [ proxyUnit ];
                RuntimeDirectoryMode = "0700";
                ExecStartPre = copyKeys;
              }
          );
        # A change of the tenants reloads the proxy instead (proxy.nix).
        reloadTriggers = [ (builtins.toJSON (proxyLib.reloadView config)) ];
      };
      copyKeys =
        if config.proxy.apiKeysFile == null then
          [ ]
        else
          [
            ("+" + escapeExecArgs [
              shell
              (writeText "mtpstack-proxy-copy-keys" (copyKeysScript coreutilsBin))
              config.proxy.apiKeysFile
              proxyRuntimeDir
            ])
          ];
    in
    builtins.listToAttrs workerUnitList
    // (if parts.proxy then { ${proxyUnit} = proxy; } else { });
in
{
  inherit
    escapeExecArg
    escapeExecArgs
    workerUnit
    rankUnit
    ranksHere
    proxyUnit
    apiKeysCredential
    proxyRuntimeDir
    copyKeysScript
    runtimeConfig
    units
    ;
}
