# The three machines of the example fleet: what flake.nix deploys and what
# tests/nix/test_placement_modules.py evaluates, host by host. `modules` are
# the host's mtpstack settings (the fleet and its own name); flake.nix adds
# the platform's own (boot, stateVersion, ...).
let
  host = platform: system: address: name: {
    inherit platform system address;
    modules = [
      ./fleet.nix
      { networking.hostName = name; }
    ];
  };
in
builtins.mapAttrs (name: make: make name) {
  gateway = host "nixos" "x86_64-linux" "10.0.0.1";
  mac1 = host "darwin" "aarch64-darwin" "10.0.0.11";
  mac2 = host "darwin" "aarch64-darwin" "10.0.0.12";
}
