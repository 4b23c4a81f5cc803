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
      # The proxy reads the fleet at a path that outlives generations, so an
      # edit it does not act on leaves it running (lib/proxy.nix).
      configFile = mtpLib.proxy.configPath;
      binDir = "${cfg.package}/bin";
      inherit stateDir logDir user;
      inherit (pkgs) writeText;
      inherit (cfg) hostName;
      group = user;
    };

    # The checked fleet file (built only if `mtpstack validate` accepts it,
    # with checkConfig): what the proxy reads, and what `mtpstack validate`,
    # `status` and `weights` can be pointed at on the Mac. nix-darwin links
    # /etc before it (re)loads daemons (modules/system/activation-scripts.nix).
    environment.etc.${mtpLib.proxy.etcName}.source = configFile;

    # nix-darwin creates only the accounts it is told it owns.
    users.knownUsers = [ user ];
    users.knownGroups = [ user ];
    users.users.${user} = {
      uid = lib.mkDefault defaultId;
      # The account's primary group follows the group's gid, as nix-darwin's
      # own services do (modules/services/ofborg/default.nix,
      # hercules-ci-agent): moving `users.groups._mtpstack.gid` moves both.
      gid = lib.mkDefault config.users.groups.${user}.gid;
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

    # MLX compiles JACCL only into its macOS 26 Metal wheels (modules/pins.nix).
    assertions = map (name: {
      assertion = cfg.package.passthru.jaccl or false;
      message =
        "worker `${name}` runs a rank on this Mac with `services.mtpstack.workers.${name}.distributed.backend` `jaccl`,"
        + " but `services.mtpstack.package` carries an mlx without JACCL: MLX compiles it only into the macOS 26 build of its Metal wheels"
        + " (deployment target 26.2, mlx/distributed/jaccl/CMakeLists.txt), and without it every rank fails to start."
        + " Leave `services.mtpstack.package` at its default, which takes that build on such a host, or build yours with"
        + " `pkgs.callPackage <mtpstack>/modules/package.nix { macosVariant = \"26\"; }` (a package whose `passthru.jaccl` is true); the Mac must run macOS 26.2 or later";
    }) (mtpLib.distributed.jacclWorkersOn cfg.renderedConfig cfg.hostName);

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
