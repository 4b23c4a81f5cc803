# A rendered config and this host's name -> what `openFirewall` opens here.
# The proxy's port to everyone, on the host that runs the proxy (as before
# placement); a worker placed here while the proxy runs elsewhere: its port
# to the proxy host's address only. `allowedTCPPorts` cannot filter by
# source, so those are rules for nftables (`extraInputRules`) and iptables
# (`extraCommands`, into NixOS' `nixos-fw` chain, which it flushes on reload).
let
  placement = import ./placement.nix;

  # 10.0.0.1 or fd00::1 (an IP literal: nftables takes no host names).
  isIpLiteral =
    address:
    builtins.match "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}" address != null
    || builtins.match "[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*" address != null;

  rules =
    { config, hostName }:
    let
      parts = placement.partsOn config hostName;
      # Workers here that the proxy dials from another host.
      remote = builtins.filter (placement.isRemote config) parts.workers;
      source = config.hosts.${config.proxy.deployOn}.address or null;
      v6 = source != null && builtins.match ".*:.*" source != null;
      ports = map (name: toString config.workers.${name}.port) remote;
    in
    {
      allowedTCPPorts = if parts.proxy then [ config.proxy.port ] else [ ];
      # [ { worker, port, source } ] for assertions and documentation.
      sourceFiltered = map (name: {
        worker = name;
        inherit (config.workers.${name}) port;
        inherit source;
      }) remote;
      nftables = builtins.concatStringsSep "" (
        map (port: "${if v6 then "ip6" else "ip"} saddr ${source} tcp dport ${port} accept\n") ports
      );
      iptables = builtins.concatStringsSep "" (
        map (
          port:
          "${if v6 then "ip6tables" else "iptables"} -A nixos-fw -p tcp -s ${source} --dport ${port} -j nixos-fw-accept\n"
        ) ports
      );
    };
in
{
  inherit isIpLiteral rules;
}
