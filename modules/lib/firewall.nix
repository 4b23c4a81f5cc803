# A rendered config and this host's name -> what `openFirewall` opens here.
# The proxy's port to everyone, on the host that runs the proxy (as before
# placement); a worker placed here while the proxy runs elsewhere: its port
# to the proxy host's address only. `allowedTCPPorts` cannot filter by
# source, so those are rules for nftables (`extraInputRules`) and iptables
# (`extraCommands`, into NixOS' `nixos-fw` chain, which it flushes on reload).
let
  placement = import ./placement.nix;
  distributed = import ./distributed.nix;

  # 10.0.0.1 or fd00::1 (an IP literal: nftables takes no host names).
  isIpLiteral =
    address:
    builtins.match "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}" address != null
    || builtins.match "[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*" address != null;

  # "ip" (IPv4) or "ip6" for an IP literal, as nftables names the families;
  # null for a host name, whose family only the resolver knows.
  family =
    address:
    if !(isIpLiteral address) then
      null
    else if builtins.match ".*:.*" address != null then
      "ip6"
    else
      "ip";

  # Where a worker listens on every address: mtpstack/runtime.py's
  # WILDCARD_HOSTS (tests/nix/test_nix_lib.py compares the two). The empty
  # host (asyncio's "every interface") cannot be set here (the options are
  # nonEmptyStr) but is listed so the two lists stay one.
  wildcardHosts = [
    "0.0.0.0"
    "::"
    "[::]"
    "*"
    ""
  ];

  # Workers on `hostName` that the proxy dials from another host while they
  # listen on every address: where no rule restricts their port (nix-darwin
  # has no port firewall), any host on the network reaches them.
  exposed =
    { config, hostName }:
    # An unplaced proxy is an error of its own (placement.nix).
    if config.proxy.deployOn == null then
      [ ]
    else
      builtins.filter (
        name:
        placement.isRemote config name
        && builtins.elem config.workers.${name}.host wildcardHosts
        && builtins.elem (distributed.rankOn config.workers.${name} hostName) [ null 0 ]
      ) (placement.partsOn config hostName).workers;

  rules =
    { config, hostName }:
    let
      parts = placement.partsOn config hostName;
      proxyHost = config.proxy.deployOn;
      # Only a proxy placed on a declared host has an address to admit; any
      # other placement is an error of its own (placement.nix).
      proxyPlaced = proxyHost != null && config.hosts ? ${proxyHost};
      source = if proxyPlaced then config.hosts.${proxyHost}.address else null;
      # Workers here that the proxy dials from another host, each with the
      # address it is dialled at: the proxy connects from its own address
      # of that family, so the rule's family is the dialled one's.
      # Only a distributed worker's rank 0 serves HTTP.
      http = builtins.filter (name: builtins.elem (distributed.rankOn config.workers.${name} hostName) [ null 0 ]) parts.workers;
      remote = if proxyPlaced then builtins.filter (placement.isRemote config) http else [ ];
      rule =
        name:
        let
          dialled = placement.dialHost config name;
        in
        {
          worker = name;
          inherit (config.workers.${name}) port;
          inherit proxyHost source dialled;
          family = if family dialled != null then family dialled else family source;
        };
      filtered = map rule remote;
      # A distributed worker's rank here admits its peers (the other ranks'
      # hosts) to its rank port: `basePort + rank` at this host's address.
      rankRules = builtins.concatMap (
        name:
        let
          w = config.workers.${name};
          rank = distributed.rankOn w hostName;
          peers = builtins.filter (h: h != hostName && config.hosts ? ${h}) w.distributed.hosts;
        in
        if rank == null || !(config.hosts ? ${hostName}) then
          [ ]
        else
          map (h: {
            worker = name;
            port = distributed.basePort w + rank;
            source = config.hosts.${h}.address;
            family = family config.hosts.${hostName}.address;
          }) peers
      ) (if hostName == null then [ ] else parts.workers);
      # Rules whose source cannot match are refused by the modules'
      # assertions before these texts are used (a rank's peers by the
      # validator's `distributed-needs-ip`).
      usable = builtins.filter (r: r.family != null && r.family == family r.source) (filtered ++ rankRules);
    in
    {
      allowedTCPPorts = if parts.proxy then [ config.proxy.port ] else [ ];
      # [ { worker, port, proxyHost, source, dialled, family } ] for the assertions.
      sourceFiltered = filtered;
      # [ { worker, port, source, family } ]: peers admitted to rank ports here.
      inherit rankRules;
      nftables = builtins.concatStringsSep "" (
        map (r: "${r.family} saddr ${r.source} tcp dport ${toString r.port} accept\n") usable
      );
      # `-w`: wait for the xtables lock, as NixOS' own rules do.
      iptables = builtins.concatStringsSep "" (
        map (
          r:
          "${
            if r.family == "ip6" then "ip6tables" else "iptables"
          } -w -A nixos-fw -p tcp -s ${r.source} --dport ${toString r.port} -j nixos-fw-accept\n"
        ) usable
      );
    };
in
{
  inherit
    isIpLiteral
    family
    wildcardHosts
    exposed
    rules
    ;
}
