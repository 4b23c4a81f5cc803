# The three machines of the example fleet: what flake.nix deploys and what
# tests/nix/test_placement_modules.py evaluates, host by host. `modules` are
# the host's mtpstack settings; flake.nix adds the platform's own (boot,
# stateVersion, ...).
{
  gateway = {
    platform = "nixos";
    system = "x86_64-linux";
    address = "10.0.0.1";
    modules = [
      ./fleet.nix
      { networking.hostName = "gateway"; }
    ];
  };
  mac1 = {
    platform = "darwin";
    system = "aarch64-darwin";
    address = "10.0.0.11";
    modules = [
      ./fleet.nix
      { networking.hostName = "mac1"; }
    ];
  };
  mac2 = {
    platform = "darwin";
    system = "aarch64-darwin";
    address = "10.0.0.12";
    modules = [
      ./fleet.nix
      { networking.hostName = "mac2"; }
    ];
  };
}
