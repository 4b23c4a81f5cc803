{
  description = "An mtpstack fleet on three hosts: two Macs with one worker each, a NixOS gateway with the proxy";

  # Edit `mtpstack.url` to where you get mtpstack from; `nix flake lock`
  # pins every input (run it where GitHub is reachable).
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    nix-darwin = {
      url = "github:nix-darwin/nix-darwin";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    deploy-rs = {
      url = "github:serokell/deploy-rs";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    colmena = {
      url = "github:zhaofengli/colmena";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    mtpstack = {
      url = "git+https://example.org/mtpstack";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      nix-darwin,
      deploy-rs,
      colmena,
      mtpstack,
    }:
    let
      hosts = import ./hosts.nix;
      nixosHosts = nixpkgs.lib.filterAttrs (_: h: h.platform == "nixos") hosts;
      darwinHosts = nixpkgs.lib.filterAttrs (_: h: h.platform == "darwin") hosts;

      # The gateway's own machine settings: replace with your hardware's.
      nixosBase = {
        boot.loader.grub.device = "nodev";
        fileSystems."/" = {
          device = "/dev/disk/by-label/nixos";
          fsType = "ext4";
        };
        system.stateVersion = "25.11";
      };
      # The account you log in to the Macs with over SSH (macOS admits no
      # root login): an administrator, who may sudo.
      macAdmin = "admin";
      darwinBase = {
        system.stateVersion = 6;
        # deploy-rs copies the closure as `macAdmin`, whose paths the Mac's
        # nix-daemon accepts only from a trusted user (nix-darwin's
        # `nix.settings`; with `nix.enable = false`, set it in the installer's
        # /etc/nix/nix.conf instead).
        nix.settings.trusted-users = [
          "root"
          macAdmin
        ];
      };

      nixosModules = h: [ mtpstack.nixosModules.default nixosBase ] ++ h.modules;
      darwinModules = h: [ mtpstack.darwinModules.default darwinBase ] ++ h.modules;

      # Where you run the deploy tools from.
      deploySystems = [
        "x86_64-linux"
        "aarch64-linux"
        "aarch64-darwin"
      ];
    in
    {
      # The deploy tools from this flake's own inputs: `nix run .#colmena -- apply`
      # and `nix run .#deploy-rs -- .#mac1`. colmena's CLI accepts only the hive
      # schema of its own version (`colmenaHive` below is colmena main's `v0.5`;
      # nixpkgs' colmena 0.4.0 requires `v0` and refuses it), so it must be the
      # same colmena as `colmena.lib.makeHive`.
      apps = nixpkgs.lib.genAttrs deploySystems (system: {
        colmena = colmena.apps.${system}.colmena;
        deploy-rs = deploy-rs.apps.${system}.deploy-rs;
      });
      devShells = nixpkgs.lib.genAttrs deploySystems (system: {
        default = nixpkgs.legacyPackages.${system}.mkShell {
          packages = [
            colmena.packages.${system}.colmena
            deploy-rs.packages.${system}.deploy-rs
          ];
        };
      });

      # deploy-rs' checks (its README: "highly advised"): the `deploy` output
      # against deploy-rs' schema, and each profile's activation scripts. Both
      # build from the Macs' darwin systems, so only on a Mac (`nix flake check`
      # there); on Linux they would need a darwin builder.
      checks.aarch64-darwin = deploy-rs.lib.aarch64-darwin.deployChecks self.deploy;

      # NixOS hosts: `nixos-rebuild` or colmena.
      nixosConfigurations = builtins.mapAttrs (
        name: h:
        nixpkgs.lib.nixosSystem {
          inherit (h) system;
          modules = nixosModules h;
        }
      ) nixosHosts;

      # `nix run .#colmena -- apply --on gateway`: colmena reads the
      # `colmenaHive` output, made by `colmena.lib.makeHive` from a hive of
      # NixOS hosts.
      colmenaHive = colmena.lib.makeHive (
        {
          meta.nixpkgs = import nixpkgs { system = "x86_64-linux"; };
        }
        // builtins.mapAttrs (name: h: {
          imports = nixosModules h;
          deployment = {
            targetHost = h.address;
            targetUser = "root";
            # Built on the gateway itself, so a Mac can deploy it without a
            # Linux builder.
            buildOnTarget = true;
          };
          nixpkgs.hostPlatform = h.system;
        }) nixosHosts
      );

      # nix-darwin hosts: `darwin-rebuild` on the Mac, or deploy-rs.
      darwinConfigurations = builtins.mapAttrs (
        name: h:
        nix-darwin.lib.darwinSystem {
          inherit (h) system;
          modules = darwinModules h;
        }
      ) darwinHosts;

      # `nix run .#deploy-rs -- .#mac1` (deploy-rs activates nix-darwin with
      # `activate.darwin`)
      deploy.nodes = builtins.mapAttrs (name: h: {
        hostname = h.address;
        sshUser = macAdmin;
        # Activation runs as root, through `sudo -u root` (deploy-rs' default
        # `sudo`); without NOPASSWD sudo on the Mac deploy-rs asks for the
        # password.
        interactiveSudo = true;
        # A darwin system builds on a Mac only: build it on the target, so a
        # Linux machine can deploy without a darwin builder.
        remoteBuild = true;
        profiles.system = {
          user = "root";
          path = deploy-rs.lib.${h.system}.activate.darwin self.darwinConfigurations.${name};
        };
      }) darwinHosts;
    };
}
