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

  # A store path that is not built: the module only interpolates these. As
  # with real derivations, the path follows everything it is built from, so
  # two evaluations' units differ exactly where their inputs do.
  fakeDrv = name: inputs: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/${
      builtins.substring 0 32 (builtins.hashString "sha256" (builtins.toJSON [ name inputs ]))
    }-${name}";
  };
  pkgs = {
    writeText = name: text: "${(fakeDrv name text).outPath}";
    runCommand = name: env: script: fakeDrv name [ env script ];
    coreutils = fakeDrv "coreutils" "";
    runtimeShell = "/bin/sh";
    # The package's own passthru says whether its mlx has JACCL: the macOS 26
    # build of the Metal wheels (modules/package.nix, tests/nix/test_package.py).
    callPackage =
      _: args:
      fakeDrv "mtpstack" args
      // {
        passthru = {
          macosVariant = args.macosVariant or "14";
          jaccl = (args.macosVariant or "14") == "26";
        };
      };
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
      # NixOS' and nix-darwin's `environment.etc.<name>.source`.
      environment.etc = mkOption {
        type = types.attrsOf (types.submodule { options.source = mkOption { type = types.path; }; });
        default = { };
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
          # As nix-darwin's modules/users/user.nix and group.nix: a user's
          # primary group is `gid`, 20 (staff) unless set.
          users.users = mkOption {
            type = types.attrsOf (
              types.submodule {
                freeformType = types.lazyAttrsOf types.anything;
                options.uid = mkOption { type = types.int; };
                options.gid = mkOption {
                  type = types.int;
                  default = 20;
                };
              }
            );
            default = { };
          };
          users.groups = mkOption {
            type = types.attrsOf (
              types.submodule {
                freeformType = types.lazyAttrsOf types.anything;
                options.gid = mkOption { type = types.int; };
              }
            );
            default = { };
          };
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
    etc = builtins.mapAttrs (_: e: toString e.source) config.environment.etc;
    package = config.services.mtpstack.package.passthru;
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
        # The text nix-darwin writes to /Library/LaunchDaemons and `diff`s to
        # decide a reload (modules/launchd/default.nix, system/launchd.nix).
        plists = builtins.mapAttrs (
          _: d: lib.generators.toPlist { escape = true; } d.serviceConfig
        ) config.launchd.daemons;
        knownUsers = config.users.knownUsers;
        accounts = {
          users = builtins.mapAttrs (_: u: { inherit (u) uid gid; }) config.users.users;
          groups = builtins.mapAttrs (_: g: { inherit (g) gid; }) config.users.groups;
        };
        activation = {
          extraActivation = config.system.activationScripts.extraActivation.text;
          postActivation = config.system.activationScripts.postActivation.text;
        };
      }
  );
in
checkAssertWarn config.assertions config.warnings result
