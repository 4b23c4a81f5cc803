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

  # JACCL's device file as `mlx.launch` writes it (MLX_IBV_DEVICES): the
  # worker's `ibvDevices`, one row per rank.
  ibvDevicesText = config: name: builtins.toJSON config.workers.${name}.distributed.ibvDevices;

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
          # JACCL (mlx/distributed/jaccl/lib/jaccl/jaccl.cpp) reads these
          # three; the group's size is the device file's number of rows.
          MLX_JACCL_COORDINATOR = builtins.head (peers config name);
          MLX_IBV_DEVICES = "${writeText "mtpstack-${name}-ibv-devices.json" (ibvDevicesText config name)}";
        }
    );

  # An IPv4 address as MLX's distributed backends take it (a dotted quad,
  # each part 0-255 without leading zeros, nothing around it), the twin of
  # the validator's `is_ipv4` (Python's ipaddress.IPv4Address).
  isIPv4 =
    address:
    let
      octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])";
    in
    builtins.match "${octet}\\.${octet}\\.${octet}\\.${octet}" address != null;

  # The workers with a `jaccl` rank on `host` (null: any host), sorted.
  jacclWorkersOn =
    config: host:
    builtins.filter (
      name:
      let
        d = config.workers.${name}.distributed or null;
      in
      d != null && d.backend == "jaccl" && (host == null || builtins.elem host d.hosts)
    ) (builtins.attrNames config.workers);

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
        # MLX's ring (mlx/distributed/utils.cpp) and JACCL's side channel
        # (jaccl/tcp.cpp) split `ip:port` at the first colon and open AF_INET
        # sockets: the ring dials every rank, JACCL's ranks meet at rank 0.
        ++ map (x: {
          code = "distributed-needs-ip";
          path = [ "hosts" x.host "address" ];
          message =
            (
              if d.backend == "ring" then
                "the ring backend connects the ranks of worker `${name}` by IPv4 address"
              else
                "the ranks of worker `${name}` (backend jaccl) meet at rank 0's IPv4 address, its coordinator"
            )
            + " (MLX splits `address:port` at the first colon and opens IPv4 sockets), but ${show [ "hosts" x.host "address" ]} is `${config.hosts.${x.host}.address}` (rank ${toString x.i}). Give the host its IPv4 address";
        }) (
          builtins.filter (x: config.hosts ? ${x.host} && !(isIPv4 config.hosts.${x.host}.address)) (
            if d.backend == "ring" then indexed else [ (builtins.head indexed) ]
          )
        )
        ++ ibvDevicesErrors show name d;

      # JACCL reads its RDMA devices from MLX_IBV_DEVICES, and `mlx.launch`
      # requires one row per rank with null at the rank's own place.
      ibvDevicesErrors =
        show: name: d:
        let
          path = [ "workers" name "distributed" "ibvDevices" ];
          n = builtins.length d.hosts;
          rows = d.ibvDevices;
          badRows = builtins.filter (
            r:
            let
              row = builtins.elemAt rows r;
            in
            builtins.length row != n || builtins.elemAt row r != null
          ) (builtins.genList (r: r) n);
        in
        if d.backend != "jaccl" then
          [ ]
        else if rows == null then
          [
            {
              code = "distributed-ibv-devices";
              inherit path;
              message = "worker `${name}` uses the jaccl backend, which reads the RDMA devices connecting its ${toString n} ranks from a file (MLX_IBV_DEVICES), but ${show path} is not set. Set it: one row per rank in `hosts` order, null for the rank itself, else the device toward that rank (`ibv_devices` on each Mac lists them)";
            }
          ]
        else if builtins.length rows != n then
          [
            {
              code = "distributed-ibv-devices";
              inherit path;
              message = "worker `${name}` has ${toString n} ranks but ${show path} has ${toString (builtins.length rows)} rows; give one row per rank, in `hosts` order";
            }
          ]
        else
          map (r: {
            code = "distributed-ibv-devices";
            path = path ++ [ (toString r) ];
            message = "${show (path ++ [ (toString r) ])} must name a device toward each of the ${toString n} ranks and hold null at its own place (entry ${toString r})";
          }) badRows;
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
    ibvDevicesText
    environment
    isIPv4
    jacclWorkersOn
    errors
    ;
}
