# A stand-in for nixpkgs, enough for `nix flake check` of this flake offline:
# nixpkgs' `lib` plus a few builders made from `derivation` and /bin/sh. The
# package is the test's own Python (`python -m mtpstack`), so the checks run
# the real validator. Used by tests/nix/test_flake.py only.
{
  lib,
  python,
}:
let
  mkPkgs =
    system:
    let
      hostPlatform = {
        inherit system;
        isLinux = lib.hasSuffix "-linux" system;
        isDarwin = lib.hasSuffix "-darwin" system;
        isAarch64 = lib.hasPrefix "aarch64-" system;
      };
      build =
        name: script: env:
        derivation (
          {
            inherit name system;
            builder = "/bin/sh";
            args = [
              "-c"
              script
            ];
            PATH = lib.concatMapStringsSep ":" (d: "${d}/bin") (env.nativeBuildInputs or [ ]) + ":/usr/bin:/bin";
          }
          // builtins.removeAttrs env [ "nativeBuildInputs" ]
        );
      tool = name: build name "mkdir -p $out/bin && touch $out/bin/${name}" { };
      mtpstack =
        build "mtpstack"
          ''
            mkdir -p $out/bin
            printf '#!/bin/sh\nexec %s -m mtpstack "$@"\n' ${python} > $out/bin/mtpstack
            chmod +x $out/bin/mtpstack
          ''
          { }
        // {
          passthru.python.pkgs = lib.genAttrs [ "hypothesis" "openai" "pytest" "pytest-aiohttp" ] tool;
        };
    in
    {
      inherit lib;
      stdenv = {
        inherit hostPlatform;
      };
      callPackage = _path: _args: mtpstack;
      writeText =
        name: text:
        build name "printf '%s' \"$text\" > $out" {
          inherit text;
        };
      runCommand = name: env: script: build name script env;
      mkShell = args: build "shell" "touch $out" { nativeBuildInputs = args.packages ++ (args.inputsFrom or [ ]); };
      nix = tool "nix";
      coreutils = tool "coreutils";
      runtimeShell = "/bin/sh";
      nixfmt = tool "nixfmt";
      config = { };
    };
in
{
  inherit lib;
  legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" "aarch64-darwin" ] mkPkgs;
}
