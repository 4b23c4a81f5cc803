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
  stateDir = "/var/lib/mtpstack";
  logDir = "/var/log/mtpstack";
  uid = config.users.users.${user}.uid;
  gid = config.users.groups.${user}.gid;

  configFile = import ./config-file.nix {
    inherit pkgs cfg;
    contents = cfg.renderedConfig;
  };
in
{
  imports = [ ./options.nix ];

  config = lib.mkIf cfg.enable {
    launchd.daemons = mtpLib.launchd.daemons {
      config = cfg.renderedConfig;
      configFile = "${configFile}";
      binDir = "${cfg.package}/bin";
      inherit stateDir logDir user;
      inherit (cfg) hostName;
      group = user;
    };

    # nix-darwin creates only the accounts it is told it owns.
    users.knownUsers = [ user ];
    users.knownGroups = [ user ];
    users.users.${user} = {
      uid = lib.mkDefault 531;
      gid = lib.mkDefault 531;
      home = stateDir;
      createHome = true;
      shell = "/usr/bin/false";
      isHidden = true;
      description = "mtpstack daemons";
    };
    users.groups.${user} = {
      gid = lib.mkDefault 531;
      description = "mtpstack daemons";
    };

    # The daemons run as ${user}: their state and log directories must
    # exist and belong to it before launchd loads them. nix-darwin runs
    # extraActivation before its `users` step (which makes the account) and
    # `launchd` after it, so on a first switch the user does not exist yet:
    # chown by numeric id, which the account then gets.
    system.activationScripts.extraActivation.text = ''
      mkdir -p ${stateDir}/huggingface/hub ${logDir}
      chown ${toString uid}:${toString gid} ${stateDir} ${stateDir}/huggingface ${stateDir}/huggingface/hub ${logDir}
      chmod 0750 ${stateDir} ${logDir}
    '';
  };
}
