# One host of a placed fleet: `services.mtpstack.hosts.<name>`, the name being
# the machine's own (`services.mtpstack.hostName`). Names and meanings are
# those of the config file's `hosts.<name>` (validator/config.py).
{ lib, ... }:
{
  options.address = lib.mkOption {
    type = lib.types.nonEmptyStr;
    example = "10.0.0.11";
    description = ''
      Where the other hosts reach this one: the proxy dials the workers
      placed here at this address, and with `openFirewall` a worker's port
      here is opened to the proxy host's address only (an IP address, since
      nftables rules take no host names).
    '';
  };
}
