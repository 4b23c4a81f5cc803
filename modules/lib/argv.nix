# A rendered worker profile -> its command line; the twin of
# `mtpstack.validator.argv.worker_argv`, tested against it: the flags, their
# order and when each is left out are the settings table's
# (`mtpstack.validator.settings.WORKER_SETTINGS`). argv[0] is the bare program
# name (`mtpstack` or `mlx_lm.server`); callers resolve it to a path.
#
# The weight paths and the draft depth are arguments on purpose: the running
# process's own command line then proves which weights it loaded.
let
  # `drafter.depth`: a number, or a depth per workload class whose `default`
  # goes to `--draft-depth` and the rest to `--draft-depth-map code=4,prose=2`
  # (attribute names come sorted, as `mtpstack.validator.argv.format_depth_map` sorts).
  isMap = d: builtins.isAttrs d;
  defaultDepth =
    d:
    if !(isMap d) then
      d
    else
      d.default or (builtins.foldl' (a: b: if b > a then b else a) 1 (
        builtins.filter builtins.isInt (builtins.attrValues d)
      ));
  classDepths = d: if isMap d then removeAttrs d [ "default" ] else { };
  # `--draft-max-depth` only where some depth is `auto`: a fixed depth has nothing to bound.
  hasAuto = d: builtins.elem "auto" (if isMap d then builtins.attrValues d else [ d ]);
  maxDepthArgv =
    drafter:
    if hasAuto drafter.depth then
      [
        "--draft-max-depth"
        (toString drafter.maxDepth)
      ]
    else
      [ ];
  depthMapArgv =
    d:
    let
      classes = classDepths d;
    in
    if classes == { } then
      [ ]
    else
      [
        "--draft-depth-map"
        (builtins.concatStringsSep "," (
          map (name: "${name}=${toString classes.${name}}") (builtins.attrNames classes)
        ))
      ];

  nativeArgv =
    w:
    [
      "mtpstack"
      "worker"
      "--model"
      w.target.path
      "--target-bits"
      (toString w.target.bits)
    ]
    ++ (
      if w.drafter == null then
        [ ]
      else
        [
          "--draft-model"
          w.drafter.path
          "--drafter-bits"
          (toString w.drafter.bits)
          "--draft-depth"
          (toString (defaultDepth w.drafter.depth))
        ]
        ++ depthMapArgv w.drafter.depth
        ++ maxDepthArgv w.drafter
        ++ [
          "--draft-kind"
          w.drafter.kind
        ]
    )
    ++ [
      "--max-num-seqs"
      (toString w.maxNumSeqs)
    ]
    ++ (
      if w.maxContextTokens == null then
        [ ]
      else
        [
          "--max-context-tokens"
          (toString w.maxContextTokens)
        ]
    )
    ++ [
      # C's %g, as `mtpstack.validator.format_gib` writes it: `2`, `0.5`.
      "--prefix-cache-gib"
      (builtins.toJSON w.prefixCache.maxGiB)
    ]
    # The disk tier's budget only with a directory: without one there is no
    # disk tier to bound.
    ++ (
      if w.prefixCache.dir == null then
        [ ]
      else
        [
          "--prefix-cache-dir"
          w.prefixCache.dir
          "--prefix-cache-disk-gib"
          (builtins.toJSON w.prefixCache.diskGiB)
        ]
    )
    ++ [
      "--served-model-name"
      w.model
      "--host"
      w.host
      "--port"
      (toString w.port)
    ]
    # Every rank runs this same argv; its rank and peers come in the
    # environment (distributed.nix), as `mlx.launch` would set it.
    ++ (
      if w.distributed == null then
        [ ]
      else
        [
          "--distributed-backend"
          w.distributed.backend
          "--distributed-strategy"
          w.distributed.strategy
        ]
    )
    ++ w.extraArgs;

  # mlx_lm.server decodes at the larger of its two concurrency flags, so both
  # carry the batch width. With a draft model its prompt cache answers wrong
  # text after a hit, hence `--prompt-cache-size 0`; without one the prefix
  # cache budget becomes its `--prompt-cache-bytes`. It has no context cap
  # (`maxContextTokens` with it is refused: `mlx-lm-cannot-cap-context`).
  mlxLmArgv =
    w:
    [
      "mlx_lm.server"
      "--model"
      w.target.path
    ]
    ++ (
      if w.drafter == null then
        [ ]
      else
        [
          "--draft-model"
          w.drafter.path
          "--num-draft-tokens"
          (toString (defaultDepth w.drafter.depth))
        ]
    )
    ++ (
      if w.drafter != null || w.prefixCache.maxGiB == 0 then
        [
          "--prompt-cache-size"
          "0"
        ]
      else
        [
          "--prompt-cache-bytes"
          (toString (builtins.floor (w.prefixCache.maxGiB * 1073741824)))
        ]
    )
    ++ [
      "--decode-concurrency"
      (toString w.maxNumSeqs)
      "--prompt-concurrency"
      (toString w.maxNumSeqs)
      "--host"
      w.host
      "--port"
      (toString w.port)
    ]
    ++ w.extraArgs;

  workerArgv = w: if w.backend == "mlx-lm" then mlxLmArgv w else nativeArgv w;

  # The proxy reads everything from the rendered config file.
  proxyArgv = configFile: [
    "mtpstack"
    "proxy"
    "--config"
    configFile
  ];

  # Replace the bare program name by an executable path in `binDir`.
  resolve = binDir: argv: [ "${binDir}/${builtins.head argv}" ] ++ builtins.tail argv;
in
{
  inherit workerArgv proxyArgv resolve;
}
