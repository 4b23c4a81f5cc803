# The defaults of the config file, as in `validator/config.py`. The module's
# options take their defaults from here and `render` fills them, so the two
# cannot drift apart; tests/nix compares `render` with the pydantic model.
{
  proxy = {
    host = "127.0.0.1";
    port = 8080;
    concurrencyLimit = 1;
    modelConcurrencyLimits = { };
    queue = {
      maxWaiting = 16;
      timeoutSeconds = 30;
    };
    timeouts = {
      connectSeconds = 5;
      firstByteSeconds = 300;
      idleSeconds = 60;
      clientSeconds = 30;
    };
    routing = "affinity";
    affinityWaitSeconds = 0;
    maxBodyBytes = 1048576;
    shutdownGraceSeconds = 30;
    apiKeysFile = null;
    tenants = { };
    fairQueueing = true;
    deployOn = null;
  };
  # Filled into each of `proxy.tenants`: null is no limit.
  tenant = {
    maxConcurrent = null;
    tokensPerMinute = null;
    requestsPerMinute = null;
    weight = 1;
  };
  policy = {
    allowedBackends = [ "native" ];
  };
  worker = {
    backend = "native";
    drafter = null;
    maxContextTokens = null;
    # GiB of prompt snapshots later requests resume from; 0: off. The disk
    # tier keeps them across restarts in `dir` (null: none) within `diskGiB`.
    # The modules default `dir` to a folder in the worker's state
    # directory (`<stateDir>/workers/<name>/prefix-cache`); the config file
    # does not.
    prefixCache = {
      maxGiB = 2;
      diskGiB = 32;
      dir = null;
    };
    host = "127.0.0.1";
    extraArgs = [ ];
    deployOn = null;
    distributed = null;
  };
  # Filled into a worker's `distributed` when one is set.
  distributed = {
    backend = "ring";
    strategy = "tensor";
    basePort = null;
    # `jaccl` only (required there): the RDMA device matrix, one row per rank.
    ibvDevices = null;
  };
  # Filled into each of `hosts`.
  host = {
    memoryGiB = null;
  };
  # Filled into a worker's drafter when one is set.
  drafter = {
    kind = "auto";
    # The deepest an `auto` depth drafts (DEPTH_AUTO_MAX_DEFAULT).
    maxDepth = 4;
  };

  # Where the NixOS units (systemd's StateDirectory) and the nix-darwin
  # daemons keep their state: the model cache, and under `workers/<name>`
  # each worker's own.
  stateDir = "/var/lib/mtpstack";

  # The range every gate and batch width sits in, and the draft depth range.
  widthMin = 1;
  widthMax = 4;
  depthMin = 1;
  depthMax = 8;
  # The prefix cache budgets' ceiling (memory and disk), in GiB (as PREFIX_CACHE_GIB_MAX).
  prefixCacheGiBMax = 65536;
  backends = [ "native" "mlx-lm" ];
  distributedBackends = [ "ring" "jaccl" ];
  shardStrategies = [ "tensor" "pipeline" ];
  # A distributed worker's rank ports start this far above its port when
  # `basePort` is null (below it past 65535), as RANK_PORT_OFFSET.
  rankPortOffset = 10000;
  portMax = 65535;
  routings = [ "affinity" "first-free" ];
  # `auto`: the worker (and `mtpstack validate --deep`) detect it from the drafter's files.
  drafterKinds = [ "auto" "mtp" "model" ];
  bits = [ 2 3 4 5 6 8 "mxfp4" "bf16" "fp16" "fp32" ];
}
