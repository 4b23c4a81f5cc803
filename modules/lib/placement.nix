# Where each part of a fleet runs, the twin of `validator/placement.py`
# (tested against it): `workers.<name>.deployOn` and `proxy.deployOn` name a
# host under `hosts`, or are null ("every host that runs this fleet"). Input:
# a rendered config (see render.nix).
let
  optionPath = import ./option-path.nix;
  distributed = import ./distributed.nix;
  inherit (distributed) home;

  upper = [ "A" "B" "C" "D" "E" "F" "G" "H" "I" "J" "K" "L" "M" "N" "O" "P" "Q" "R" "S" "T" "U" "V" "W" "X" "Y" "Z" ];
  lower = [ "a" "b" "c" "d" "e" "f" "g" "h" "i" "j" "k" "l" "m" "n" "o" "p" "q" "r" "s" "t" "u" "v" "w" "x" "y" "z" ];
  toLower = builtins.replaceStrings upper lower;

  isPlaced =
    config:
    config.proxy.deployOn != null
    || builtins.any (w: home w != null) (builtins.attrValues config.workers);

  runsOn = deployOn: host: deployOn == null || deployOn == host;

  # Some part of worker `w` (a rank, for a distributed one) runs on `host`.
  workerRunsOn =
    w: host: if (w.distributed or null) != null then builtins.elem host w.distributed.hosts else runsOn w.deployOn host;

  # { proxy = bool; workers = [ names ]; } that run on `host`; null: every part.
  partsOn =
    config: host:
    let
      names = builtins.attrNames config.workers;
    in
    if host == null then
      {
        proxy = true;
        workers = names;
      }
    else
      {
        proxy = runsOn config.proxy.deployOn host;
        workers = builtins.filter (name: workerRunsOn config.workers.${name} host) names;
      };

  # Worker `name` runs on a host other than the proxy's.
  isRemote =
    config: name:
    let
      placed = home config.workers.${name};
    in
    placed != null && placed != config.proxy.deployOn;

  # Where the proxy connects to worker `name`.
  dialHost =
    config: name:
    let
      worker = config.workers.${name};
    in
    if isRemote config name && config.hosts ? ${home worker} then
      config.hosts.${home worker}.address
    else
      worker.host;

  # `localhost`, 127.0.0.0/8 and ::1, in the spellings a config uses.
  isLoopback =
    host:
    let
      h = toLower (builtins.replaceStrings [ "[" "]" ] [ "" "" ] host);
    in
    h == "localhost" || h == "::1" || builtins.match "127\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}" h != null;

  # The placement errors, each { code, path, message }; `prefix` is the
  # module's option path. Codes and paths are the validator's.
  errors =
    prefix: config:
    let
      show = path: "`${optionPath (prefix ++ path)}`";
      declared = builtins.attrNames config.hosts;
      declaredText =
        if declared == [ ] then "none" else builtins.concatStringsSep ", " (map (h: "`${h}`") declared);
      placements = [
        {
          path = [ "proxy" "deployOn" ];
          host = config.proxy.deployOn;
        }
      ]
      ++ map (name: {
        path = [ "workers" name "deployOn" ];
        host = config.workers.${name}.deployOn;
      }) (builtins.attrNames config.workers)
      ++ builtins.concatMap (
        name:
        let
          d = config.workers.${name}.distributed;
        in
        if d == null then
          [ ]
        else
          builtins.genList (i: {
            path = [ "workers" name "distributed" "hosts" (toString i) ];
            host = builtins.elemAt d.hosts i;
          }) (builtins.length d.hosts)
      ) (builtins.attrNames config.workers);
      unknown = builtins.filter (p: p.host != null && !(config.hosts ? ${p.host})) placements;
      placedWorkers = builtins.filter (name: home config.workers.${name} != null) (
        builtins.attrNames config.workers
      );
      unreachable = builtins.filter (
        name:
        isRemote config name && config.proxy.deployOn != null && isLoopback config.workers.${name}.host
      ) (builtins.attrNames config.workers);
    in
    map (p: {
      code = "unknown-host";
      inherit (p) path;
      message = "${show p.path} is `${p.host}`, which is not declared in ${show [ "hosts" ]} (declared: ${declaredText})";
    }) unknown
    ++ (
      if placedWorkers != [ ] && config.proxy.deployOn == null then
        [
          {
            code = "proxy-not-placed";
            path = [ "proxy" "deployOn" ];
            message =
              "${show [ "workers" (builtins.head placedWorkers) "deployOn" ]} places a worker on a host but ${show [ "proxy" "deployOn" ]} is null, so every host would run a proxy;"
              + " two proxies each fill the same worker's gate and together admit more than its batch width. Set it to the one host that runs the proxy";
          }
        ]
      else
        [ ]
    )
    ++ map (name: {
      code = "worker-unreachable";
      path = [ "workers" name "host" ];
      message =
        "${show [ "workers" name "host" ]} is `${config.workers.${name}.host}`: the worker runs on host `${home config.workers.${name}}` and listens on loopback only,"
        + " so the proxy on host `${config.proxy.deployOn}` cannot reach it. Listen on `0.0.0.0` (or the host's own address)";
    }) unreachable
    ++ distributed.errors prefix config;

  # The placement warnings, each { code, path, message }.
  warnings =
    prefix: config:
    map (host: {
      code = "host-runs-nothing";
      path = [ "hosts" host ];
      message = "no part of the fleet is placed on host `${host}` (`${optionPath (prefix ++ [ "hosts" host ])}`)";
    }) (
      if isPlaced config then
        builtins.filter (
          host:
          let
            parts = partsOn config host;
          in
          !parts.proxy && parts.workers == [ ]
        ) (builtins.attrNames config.hosts)
      else
        [ ]
    );
in
{
  inherit
    isPlaced
    runsOn
    workerRunsOn
    partsOn
    isRemote
    dialHost
    isLoopback
    errors
    warnings
    ;
}
