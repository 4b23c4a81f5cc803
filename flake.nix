{
  description = "mtpstack: MLX models with multi-token-prediction speculative decoding behind an admission proxy";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      systems = [
        "x86_64-linux"
        "aarch64-linux"
        "aarch64-darwin"
      ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      # The pure functions the modules are built on (builtins only).
      lib = import ./modules/lib;

      # `import`, not a bare path: Nix 2.8's flake check wants a function here.
      nixosModules.default = import ./modules/nixos.nix;
      darwinModules.default = import ./modules/darwin.nix;

      packages = forAllSystems (pkgs: {
        default = pkgs.callPackage ./modules/package.nix { };
      });

      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          inputsFrom = [ self.packages.${pkgs.stdenv.hostPlatform.system}.default ];
          packages = [
            pkgs.nix
            pkgs.nixfmt
          ]
          ++ (with self.packages.${pkgs.stdenv.hostPlatform.system}.default.passthru.python.pkgs; [
            hypothesis
            openai
            pytest
            pytest-aiohttp
          ]);
        };
      });

      formatter = forAllSystems (pkgs: pkgs.nixfmt);

      checks = forAllSystems (
        pkgs:
        import ./tests/nix/checks.nix {
          inherit pkgs nixpkgs self;
        }
      );
    };
}
