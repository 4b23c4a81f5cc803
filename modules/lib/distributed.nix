# A worker that spans hosts (`workers.<name>.distributed`), the twin of the
# distributed parts of `validator/placement.py` and `validator/rules.py`
# (tested against them): its home host, its rank ports, the ring's hostfile,
# the environment each rank starts with (what `mlx.launch` would set), and
# its errors. Input: a rendered config (see render.nix).
let
  defaults = import ./defaults.nix;
  optionPath = import ./option-path.nix;

  # The host that runs the worker's HTTP side: `deployOn`, else rank 0's host.
  home =
    w: if w.deployOn == null && (w.distributed or null) != null then builtins.head w.distributed.hosts else w.deployOn;

  # Rank 0's port for its peers (rank r: this + r).
  basePort =
    w:
    let
      up = w.port + defaults.rankPortOffset;
    in
    if w.distributed.basePort != null then
      w.distributed.basePort
    else if up + builtins.length w.distributed.hosts - 1 <= defaults.portMax then
      up
    else
      w.port - defaults.rankPortOffset;

  indexOf =
    x: l:
    let
      go = i: if i >= builtins.length l then null else if builtins.elemAt l i == x then i else go (i + 1);
    in
    go 0;

  # The rank a distributed worker runs on `host`, else null.
  rankOn = w: host: if (w.distributed or null) == null then null else indexOf host w.distributed.hosts;

  # `address:port` of each rank, in rank order; null when a host is undeclared.
  peers =
    config: name:
    let
      w = config.workers.${name};
    in
    if builtins.any (h: !(config.hosts ? ${h})) w.distributed.hosts then
      null
    else
      builtins.genList (
        r: "${config.hosts.${builtins.elemAt w.distributed.hosts r}.address}:${toString (basePort w + r)}"
      ) (builtins.length w.distributed.hosts);

  # The ring backend's hostfile as `mlx.launch` writes it: one list of
  # `ip:port` per rank.
  hostfileText = config: name: builtins.toJSON (map (p: [ p ]) (peers config name));

  # What rank `rank` of worker `name` starts with. `writeText name text`
  # makes the hostfile a file (builtins.toFile where nothing else is at hand).
  environment =
    {
      config,
      name,
      rank,
      writeText ? builtins.toFile,
    }:
    let
      w = config.workers.${name};
    in
    {
      MLX_RANK = toString rank;
    }
    // (
      if w.distributed.backend == "ring" then
        { MLX_HOSTFILE = "${writeText "mtpstack-${name}-hostfile.json" (hostfileText config name)}"; }
      else
        {
          # JACCL's coordinator is rank 0; the RDMA device map (MLX_IBV_DEVICES)
          # names each Mac's Thunderbolt ports and comes from the operator.
          MLX_WORLD_SIZE = toString (builtins.length w.distributed.hosts);
          MLX_JACCL_COORDINATOR = builtins.head (peers config name);
        }
    );

  isIp =
    address:
    let
      a = builtins.replaceStrings [ "[" "]" ] [ "" "" ] address;
    in
    builtins.match "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}" a != null
    || builtins.match "[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*" a != null;

  # The errors, each { code, path, message }, with the validator's codes and paths.
  errors =
    prefix: config:
    let
      show = path: "`${optionPath (prefix ++ path)}`";
      names = builtins.filter (name: config.workers.${name}.distributed != null) (
        builtins.attrNames config.workers
      );
      perWorker =
        name:
        let
          w = config.workers.${name};
          d = w.distributed;
          path = [ "workers" name "distributed" ];
          n = builtins.length d.hosts;
          indexed = builtins.genList (i: {
            inherit i;
            host = builtins.elemAt d.hosts i;
          }) n;
          first = builtins.head d.hosts;
        in
        (
          if w.deployOn != null && w.deployOn != first then
            [
              {
                code = "distributed-deploy-on";
                path = [ "workers" name "deployOn" ];
                message = "${show [ "workers" name "deployOn" ]} is `${w.deployOn}`, but the worker spans hosts and its rank 0 (its HTTP side) runs on the first of ${show (path ++ [ "hosts" ])}, `${first}`. Set it to null, or list `${w.deployOn}` first";
              }
            ]
          else
            [ ]
        )
        ++ map (x: {
          code = "distributed-duplicate-host";
          path = path ++ [ "hosts" (toString x.i) ];
          message = "${show (path ++ [ "hosts" ])} lists host `${x.host}` twice; each host runs one rank";
        }) (builtins.filter (x: indexOf x.host d.hosts != x.i) indexed)
        ++ (
          if w.backend != "native" then
            [
              {
                code = "distributed-needs-native";
                inherit path;
                message = "${show path} is set, but backend `${w.backend}` runs on one host; only the native worker spans hosts";
              }
            ]
          else
            [ ]
        )
        ++ (
          if d.backend == "ring" then
            map (x: {
              code = "distributed-needs-ip";
              path = [ "hosts" x.host "address" ];
              message = "the ring backend connects the ranks of worker `${name}` by IP address, but ${show [ "hosts" x.host "address" ]} is `${config.hosts.${x.host}.address}`. Give the host its IP address";
            }) (builtins.filter (x: config.hosts ? ${x.host} && !(isIp config.hosts.${x.host}.address)) indexed)
          else
            [ ]
        );
    in
    builtins.concatMap perWorker names;
in
{
  inherit
    home
    basePort
    rankOn
    peers
    hostfileText
    environment
    errors
    ;
}
