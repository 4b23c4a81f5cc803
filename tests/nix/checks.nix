# The flake's `checks`: the same checks tests/nix runs with pytest, for where
# nixpkgs is reachable (`nix flake check`).
{
  pkgs,
  nixpkgs,
  self,
}:
let
  inherit (pkgs) lib;
  system = pkgs.stdenv.hostPlatform.system;
  mtp = import ../../modules/lib;
  package = self.packages.${system}.default;

  examples =
    kind:
    let
      dir = ../../examples/nix + "/${kind}";
    in
    map (name: dir + "/${name}") (
      builtins.filter (lib.hasSuffix ".nix") (builtins.attrNames (builtins.readDir dir))
    );
  valid = examples "valid";
  invalid = examples "invalid";

  expectedCode =
    file:
    lib.trim (
      lib.removePrefix "# expect:" (
        lib.findFirst (lib.hasPrefix "# expect:") (throw "${toString file} has no `# expect: CODE` line") (
          lib.splitString "\n" (builtins.readFile file)
        )
      )
    );

  rendered =
    file:
    pkgs.writeText "${lib.removeSuffix ".nix" (baseNameOf file)}.json" (
      builtins.toJSON (mtp.render (import file).services.mtpstack)
    );

  evalModule =
    platform: file:
    import ./eval-module.nix {
      inherit lib platform;
      settings = import file;
    };
in
{
  package = package;
  devShell = self.devShells.${system}.default;

  # The pure functions' unit tests (tests/nix/lib-tests.nix).
  lib-tests =
    pkgs.runCommand "mtpstack-lib-tests" { failures = builtins.toJSON (import ./lib-tests.nix); }
      ''
        if [ "$failures" != "[]" ]; then
          echo "pure Nix tests failed: $failures" >&2
          exit 1
        fi
        touch $out
      '';

  # Every example fleet rendered and run through `mtpstack validate`; the
  # invalid ones must fail with the code they announce.
  examples = pkgs.runCommand "mtpstack-examples" { nativeBuildInputs = [ package ]; } ''
    ${lib.concatMapStrings (file: ''
      mtpstack validate ${rendered file}
    '') valid}
    ${lib.concatMapStrings (file: ''
      if mtpstack validate --format json ${rendered file} > report.json; then
        echo "${baseNameOf file}: expected \`mtpstack validate\` to fail" >&2
        exit 1
      fi
      grep -q '"code": "${expectedCode file}"' report.json || {
        echo "${baseNameOf file}: expected code ${expectedCode file}" >&2
        cat report.json >&2
        exit 1
      }
    '') invalid}
    touch $out
  '';

  # Both modules evaluate every valid example (platform options stubbed, as
  # in tests/nix/test_nix_modules.py).
  modules = pkgs.writeText "mtpstack-module-eval.json" (
    builtins.toJSON (
      map (file: {
        nixos = evalModule "nixos" file;
        darwin = evalModule "darwin" file;
      }) valid
    )
  );
}
# Only where the full nixpkgs is at hand (not with a lib-only stand-in).
// lib.optionalAttrs (pkgs.stdenv.hostPlatform.isLinux && nixpkgs.lib ? nixosSystem) {
  # A real NixOS evaluation of the module: the proxy's unit file, built with
  # checkConfig on (so `mtpstack validate` runs on the rendered config).
  nixos-unit =
    (nixpkgs.lib.nixosSystem {
      inherit system;
      modules = [
        self.nixosModules.default
        (import ../../examples/nix/valid/mixed-fleet.nix)
        {
          boot.isContainer = true;
          system.stateVersion = "25.11";
        }
      ];
    }).config.systemd.units."mtpstack-proxy.service".unit;
}
