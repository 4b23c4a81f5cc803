# nix-darwin: one launchd daemon per worker and one for the proxy, rendered
# by ./lib from `services.mtpstack`.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.mtpstack;
  mtpLib = import ./lib;
  user = "_mtpstack";
  inherit (mtpLib.defaults) stateDir;
  logDir = "/var/log/mtpstack";
  uid = config.users.users.${user}.uid;
  gid = config.users.groups.${user}.gid;

  configFile = import ./config-file.nix {
    inherit pkgs cfg;
    contents = cfg.renderedConfig;
  };

  # nix-darwin's own accounts take 350 and up (nixbld), 399, 530-535
  # (modules/misc/ids.nix, services/{ofborg,gitlab-runner,github-runner,...});
  # macOS gives people 501 and up. A hidden system account below 500, taken
  # by none of those. nix-darwin refuses two managed users with one uid at
  # evaluation (`users.uids`, modules/users/default.nix).
  defaultId = 470;

  # The prefix-cache directories of the workers that run here.
  cacheDirs = builtins.filter (dir: dir != null) (
    map (name: cfg.renderedConfig.workers.${name}.prefixCache.dir)
      (mtpLib.placement.partsOn cfg.renderedConfig cfg.hostName).workers
  );

  exposed = mtpLib.firewall.exposed {
    config = cfg.renderedConfig;
    inherit (cfg) hostName;
  };
  ownAddress =
    if cfg.hostName != null && cfg.hosts ? ${cfg.hostName} then
      "`${cfg.hosts.${cfg.hostName}.address}` (`services.mtpstack.hosts.${cfg.hostName}.address`)"
    else
      "this host's own address";
in
{
  imports = [ ./options.nix ];

  config = lib.mkIf cfg.enable {
    launchd.daemons = mtpLib.launchd.daemons {
      config = cfg.renderedConfig;
      configFile = "${configFile}";
      binDir = "${cfg.package}/bin";
      inherit stateDir logDir user;
      inherit (pkgs) writeText;
      inherit (cfg) hostName;
      group = user;
    };

    # nix-darwin creates only the accounts it is told it owns.
    users.knownUsers = [ user ];
    users.knownGroups = [ user ];
    users.users.${user} = {
      uid = lib.mkDefault defaultId;
      gid = lib.mkDefault defaultId;
      home = stateDir;
      createHome = true;
      shell = "/usr/bin/false";
      isHidden = true;
      description = "mtpstack daemons";
    };
    users.groups.${user} = {
      gid = lib.mkDefault defaultId;
      description = "mtpstack daemons";
    };

    # nix-darwin has no port firewall (only `networking.applicationFirewall`,
    # which filters per program): `openFirewall` can restrict nothing here.
    warnings = map (
      name:
      "worker `${name}` listens on `${cfg.workers.${name}.host}` (`services.mtpstack.workers.${name}.host`), every address of this Mac, for the proxy on host `${cfg.proxy.deployOn}`,"
      + " and nix-darwin has no port firewall, so any host on the network reaches it past the proxy's gate and API keys."
      + " Set it to ${ownAddress}, or restrict port ${toString cfg.workers.${name}.port} to the proxy host with pf (docs/nix.md, Firewall)"
    ) exposed;

    # The daemons run as ${user}: their state and log directories must
    # exist and belong to it before launchd loads them. nix-darwin runs
    # extraActivation before its `users` step (which makes the account) and
    # `launchd` after it, so on a first switch the user does not exist yet:
    # chown by numeric id, which the account then gets.
    # Each worker's prefix-cache directory here (by default under
    # ${stateDir}/workers) likewise.
    system.activationScripts.extraActivation.text = ''
      mkdir -p ${stateDir}/huggingface/hub ${logDir}
      chown ${toString uid}:${toString gid} ${stateDir} ${stateDir}/huggingface ${stateDir}/huggingface/hub ${logDir}
      chmod 0750 ${stateDir} ${logDir}
    ''
    + lib.concatMapStrings (dir: ''
      mkdir -p ${lib.escapeShellArg dir}
      chown ${toString uid}:${toString gid} ${lib.escapeShellArg dir}
      chmod 0750 ${lib.escapeShellArg dir}
    '') cacheDirs;
  };
}
