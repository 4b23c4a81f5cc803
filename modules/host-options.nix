# One host of a placed fleet: `services.mtpstack.hosts.<name>`, the name being
# the machine's own (`services.mtpstack.hostName`). Names and meanings are
# those of the config file's `hosts.<name>` (validator/config.py).
{ lib, ... }:
let
  defaults = import ./lib/defaults.nix;
in
{
  options.memoryGiB = lib.mkOption {
    type = lib.types.nullOr lib.types.numbers.positive;
    default = defaults.host.memoryGiB;
    example = 64;
    description = ''
      Memory this host's workers may use, in GiB. With `checkConfig`,
      `mtpstack validate` sees it, but the memory budget is checked only by
      `mtpstack validate --deep` where the model files are at hand; `null`:
      not checked.
    '';
  };

  options.address = lib.mkOption {
    type = lib.types.nonEmptyStr;
    example = "10.0.0.11";
    description = ''
      Where the other hosts reach this one: the proxy dials the workers
      placed here at this address, and with `openFirewall` on NixOS a
      worker's port here is opened to the proxy host's address only (an IP
      address of the family the proxy dials, since nftables rules take no
      host names).
    '';
  };
}
