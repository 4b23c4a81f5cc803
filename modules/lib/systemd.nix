# A rendered config -> systemd unit descriptions (the shape of NixOS'
# `systemd.services.<name>`): one unit per worker and one for the proxy.
let
  argv = import ./argv.nix;
  placement = import ./placement.nix;

  # systemd splits ExecStart= like a shell but with C-style escapes and
  # expands `%` specifiers and `$` variables: quote every argument as a JSON
  # string (systemd understands its escapes) and double `%` and `$`.
  escapeExecArg =
    arg: builtins.replaceStrings [ "%" "$" ] [ "%%" "$$" ] (builtins.toJSON (toString arg));
  escapeExecArgs = args: builtins.concatStringsSep " " (map escapeExecArg args);

  workerUnit = name: "mtpstack-worker-${name}";
  proxyUnit = "mtpstack-proxy";

  # Where the proxy finds the API keys: systemd copies the operator's file
  # (outside the store) into the unit's credentials directory.
  apiKeysCredential = "/run/credentials/${proxyUnit}.service/api-keys";

  # The config as the proxy unit reads it: the API keys file is the
  # credential's path.
  runtimeConfig =
    config:
    if config.proxy.apiKeysFile == null then
      config
    else
      config // { proxy = config.proxy // { apiKeysFile = apiKeysCredential; }; };

  # What the proxy reads at start-up only: every gate and every batch width.
  proxyTriggers = config: {
    inherit (config.proxy) concurrencyLimit modelConcurrencyLimits;
    widths = builtins.mapAttrs (_: w: w.maxNumSeqs) config.workers;
  };

  # Arguments:
  #   config      the rendered config (render.nix), as the operator wrote it
  #   configFile  the path of the runtime config file (see runtimeConfig)
  #   binDir      where `mtpstack` and `mlx_lm.server` live
  #   stateDir    the model cache (the units' StateDirectory)
  #   hardening   serviceConfig shared by every unit
  #   workerHardening  serviceConfig that only the workers get (wins over hardening)
  #   hostName    only the parts placed on this host (placement.nix); null: all
  units =
    {
      config,
      configFile,
      binDir,
      stateDir ? "/var/lib/mtpstack",
      hardening ? { },
      workerHardening ? { },
      hostName ? null,
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
      worker = name: w: {
        name = workerUnit name;
        value = {
          description = "mtpstack worker ${name} (model ${w.model}, batch width ${toString w.maxNumSeqs})";
          wantedBy = [ "multi-user.target" ];
          after = [ "network.target" ];
          inherit environment;
          # The worker reads its settings at start-up only: any change restarts it.
          restartTriggers = [ (builtins.toJSON w) ];
          serviceConfig = common // workerHardening // {
            ExecStart = escapeExecArgs (argv.resolve binDir (argv.workerArgv w));
          };
        };
      };
      # Only the workers on this host: the others are dialled over the network.
      workerUnits = map (name: "${workerUnit name}.service") parts.workers;
      proxy = {
        description = "mtpstack admission proxy";
        wantedBy = [ "multi-user.target" ];
        after = [ "network.target" ] ++ workerUnits;
        wants = workerUnits;
        inherit environment;
        restartTriggers = [ (builtins.toJSON (proxyTriggers config)) ];
        serviceConfig =
          common
          // {
            ExecStart = escapeExecArgs (argv.resolve binDir (argv.proxyArgv configFile));
            TimeoutStopSec = builtins.ceil config.proxy.shutdownGraceSeconds + 10;
          }
          // (
            if config.proxy.apiKeysFile == null then
              { }
            else
              { LoadCredential = [ "api-keys:${config.proxy.apiKeysFile}" ]; }
          );
      };
    in
    builtins.listToAttrs (map (name: worker name config.workers.${name}) parts.workers)
    // (if parts.proxy then { ${proxyUnit} = proxy; } else { });
in
{
  inherit
    escapeExecArg
    escapeExecArgs
    workerUnit
    proxyUnit
    apiKeysCredential
    runtimeConfig
    proxyTriggers
    units
    ;
}
