# Evaluate the NixOS or nix-darwin module with nixpkgs' `lib` alone: the
# platform options the module sets are stubbed and `pkgs` is a small stand-in.
# Assertions are applied as NixOS applies them (checkAssertWarn), so a failed
# one aborts with "Failed assertions:".
#
#   nix-instantiate --eval --strict --json tests/nix/eval-module.nix \
#     --arg lib 'import NIXPKGS_LIB/lib' --argstr platform nixos \
#     --arg settings 'import ./examples/nix/valid/single-mtp.nix'
{
  lib,
  platform ? "nixos",
  settings,
}:
let
  inherit (lib) mkOption types;
  any = mkOption {
    type = types.lazyAttrsOf types.anything;
    default = { };
  };

  # A store path that is not built: the module only interpolates these.
  fakeDrv = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
  };
  pkgs = {
    writeText = name: _text: "${(fakeDrv name).outPath}";
    runCommand = name: _env: _script: fakeDrv name;
    callPackage = _: _: fakeDrv "mtpstack";
    config = { };
  };

  stubs = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      warnings = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
    }
    // (
      if platform == "nixos" then
        {
          systemd.services = any;
          networking.hostName = mkOption {
            type = types.str;
            default = "nixos";
          };
          networking.nftables.enable = mkOption {
            type = types.bool;
            default = false;
          };
          networking.firewall.allowedTCPPorts = mkOption {
            type = types.listOf types.port;
            default = [ ];
          };
          networking.firewall.extraInputRules = mkOption {
            type = types.lines;
            default = "";
          };
          networking.firewall.extraCommands = mkOption {
            type = types.lines;
            default = "";
          };
        }
      else
        {
          networking.hostName = mkOption {
            type = types.nullOr types.str;
            default = null;
          };
          networking.localHostName = mkOption {
            type = types.nullOr types.str;
            default = null;
          };
          launchd.daemons = any;
          users.users = any;
          users.groups = any;
          users.knownUsers = mkOption {
            type = types.listOf types.str;
            default = [ ];
          };
          users.knownGroups = mkOption {
            type = types.listOf types.str;
            default = [ ];
          };
          system.activationScripts = lib.genAttrs [ "extraActivation" "postActivation" ] (_: {
            text = mkOption {
              type = types.lines;
              default = "";
            };
          });
        }
    );
  };

  module = if platform == "nixos" then ../../modules/nixos.nix else ../../modules/darwin.nix;

  evaluated = lib.evalModules {
    modules = [
      stubs
      module
      settings
      { _module.args.pkgs = pkgs; }
    ];
  };
  inherit (evaluated) config;

  # As NixOS and nix-darwin do; the fallback is for a lib older than checkAssertWarn.
  checkAssertWarn =
    lib.asserts.checkAssertWarn or (
      assertions: _warnings: value:
      let
        failed = map (a: a.message) (builtins.filter (a: !a.assertion) assertions);
      in
      if failed == [ ] then
        value
      else
        throw "\nFailed assertions:\n${lib.concatMapStrings (m: "- ${m}\n") failed}"
    );

  result = {
    renderedConfig = config.services.mtpstack.renderedConfig;
    inherit (config) warnings;
  }
  // (
    if platform == "nixos" then
      {
        services = config.systemd.services;
        firewall = config.networking.firewall.allowedTCPPorts;
        firewallRules = {
          nftables = config.networking.firewall.extraInputRules;
          iptables = config.networking.firewall.extraCommands;
        };
      }
    else
      {
        daemons = config.launchd.daemons;
        knownUsers = config.users.knownUsers;
        activation = {
          extraActivation = config.system.activationScripts.extraActivation.text;
          postActivation = config.system.activationScripts.postActivation.text;
        };
      }
  );
in
checkAssertWarn config.assertions config.warnings result
