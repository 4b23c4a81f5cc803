# Unit tests of the pure functions in modules/lib, `builtins` only: evaluates
# to the list of failures ([] when all pass). Run by tests/nix (pytest) and by
# the flake's `checks`.
let
  mtp = import ../../modules/lib;

  # A worker of batch width `width` on `port`, serving the 4-bit target at `path`.
  worker = path: width: port: {
    target = {
      inherit path;
      bits = 4;
    };
    maxNumSeqs = width;
    inherit port;
  };

  fleet = mtp.render {
    proxy.modelConcurrencyLimits."qwen3.8-27b" = 2;
    workers = {
      mtp = {
        model = "qwen3.8-27b";
        target = {
          path = "/srv/models/target dir";
          bits = 4;
        };
        drafter = {
          path = "/srv/models/drafter";
          bits = 6;
          depth = 3;
        };
        maxNumSeqs = 2;
        port = 8101;
      };
      plain = {
        target = {
          path = "mlx-community/plain";
          bits = "bf16";
        };
        maxNumSeqs = 3;
        port = 8102;
      };
    };
  };

  units = unitsOf fleet;

  daemons = mtp.launchd.daemons {
    config = fleet;
    configFile = "/etc/mtpstack.json";
    binDir = "/pkg/bin";
  };

  # A worker's edit changes its own trigger, and the proxy's only when it
  # touches what the proxy acts on (lib/proxy.nix's `view`): a context cap
  # does not, a port (where the proxy dials it) or a width does.
  withPlain =
    edit:
    mtp.render {
      inherit (fleet) proxy;
      workers = fleet.workers // {
        plain = fleet.workers.plain // edit;
      };
    };
  unitsOf =
    config:
    mtp.systemd.units {
      inherit config;
      configFile = "/etc/mtpstack.json";
      binDir = "/pkg/bin";
    };
  edited = withPlain { maxContextTokens = 8192; };
  moved = withPlain { port = 8103; };
  widened = withPlain { maxNumSeqs = 4; };
  # Which units an edited fleet restarts: those whose restart triggers changed.
  restartedBy =
    config:
    let
      after = unitsOf config;
      restarted = unit: after.${unit}.restartTriggers != units.${unit}.restartTriggers;
    in
    {
      plain = restarted "mtpstack-worker-plain";
      mtp = restarted "mtpstack-worker-mtp";
      proxy = restarted "mtpstack-proxy";
    };

  # A worker across two hosts, the proxy on the first.
  spanning = mtp.render {
    proxy.deployOn = "mac1";
    hosts = {
      mac1.address = "10.0.0.11";
      mac2.address = "10.0.0.12";
    };
    workers.big = worker "/srv/models/big" 1 8101 // {
      host = "0.0.0.0";
      distributed = {
        hosts = [ "mac1" "mac2" ];
        strategy = "pipeline";
      };
    };
  };
  # The hostfile's contents instead of a store path, so the tests compare text.
  inlineText = _name: text: text;
  spanningUnits =
    hostName:
    mtp.systemd.units {
      config = spanning;
      configFile = "/c";
      binDir = "/pkg/bin";
      inherit hostName;
      writeText = inlineText;
    };

  # The same worker with more `distributed` settings.
  spanningWith =
    distributed:
    mtp.render (
      spanning
      // {
        workers.big = spanning.workers.big // {
          distributed = spanning.workers.big.distributed // distributed;
        };
      }
    );
  # Over JACCL: RDMA devices between the two Macs.
  overJaccl = spanningWith {
    backend = "jaccl";
    ibvDevices = [
      [ null "rdma_en2" ]
      [ "rdma_en2" null ]
    ];
  };

  tests = {
    jacclRanksGetTheDeviceFileAndTheCoordinator = {
      expr = mtp.distributed.environment {
        config = overJaccl;
        name = "big";
        rank = 1;
        writeText = inlineText;
      };
      # What JACCL reads (jaccl/jaccl.cpp `Config::from_env`); the group's
      # size is the device file's, so no MLX_WORLD_SIZE.
      expected = {
        MLX_RANK = "1";
        MLX_JACCL_COORDINATOR = "10.0.0.11:18101";
        MLX_IBV_DEVICES = ''[[null,"rdma_en2"],["rdma_en2",null]]'';
      };
    };
    jacclWithoutDevicesIsAnError = {
      expr = map (e: { inherit (e) code path; }) (
        mtp.placement.errors [ ] (spanningWith {
          backend = "jaccl";
        })
      );
      expected = [
        {
          code = "distributed-ibv-devices";
          path = [ "workers" "big" "distributed" "ibvDevices" ];
        }
      ];
    };
    jacclWorkersAreFoundPerHost = {
      expr = map (h: mtp.distributed.jacclWorkersOn overJaccl h) [ "mac1" "mac2" "gw" null ];
      expected = [ [ "big" ] [ "big" ] [ ] [ "big" ] ];
    };
    onlyDottedQuadsAreIPv4 = {
      expr = map mtp.distributed.isIPv4 [
        "10.0.0.11"
        "255.255.255.255"
        "0.0.0.0"
        "256.0.0.1"
        "010.0.0.1"
        "[10.0.0.1]"
        "fd00::1"
        "::ffff:10.0.0.1"
        "mac1.lan"
        "10.0.0"
      ];
      expected = [ true true true false false false false false false false ];
    };
    daemonsRunInteractiveAndTheProxyOutlivesItsGrace = {
      expr = {
        types = builtins.mapAttrs (_: d: d.serviceConfig.ProcessType) daemons;
        exit = daemons.mtpstack-proxy.serviceConfig.ExitTimeOut;
        stop = units.mtpstack-proxy.serviceConfig.TimeoutStopSec;
        longer =
          (mtp.launchd.daemons {
            config = mtp.render (fleet // { proxy = fleet.proxy // { shutdownGraceSeconds = 90.5; }; });
            configFile = "/c";
            binDir = "/pkg/bin";
          }).mtpstack-proxy.serviceConfig.ExitTimeOut;
      };
      expected = {
        types = {
          mtpstack-proxy = "Interactive";
          mtpstack-worker-mtp = "Interactive";
          mtpstack-worker-plain = "Interactive";
        };
        exit = 40;
        stop = 40;
        longer = 101;
      };
    };
    theProxyDaemonCarriesItsViewOnly = {
      expr =
        let
          view =
            config:
            (mtp.launchd.daemons {
              inherit config;
              configFile = "/c";
              binDir = "/pkg/bin";
            }).mtpstack-proxy.serviceConfig.EnvironmentVariables.MTPSTACK_PROXY_VIEW_SHA256;
        in
        {
          contextCap = view edited == view fleet;
          port = view moved == view fleet;
          width = view widened == view fleet;
        };
      expected = {
        contextCap = true;
        port = false;
        width = false;
      };
    };
    distributedRendersItsDefaults = {
      expr = spanning.workers.big.distributed;
      expected = {
        hosts = [ "mac1" "mac2" ];
        backend = "ring";
        strategy = "pipeline";
        basePort = null;
        ibvDevices = null;
      };
    };
    eachHostRunsItsRankWithTheHostfile = {
      expr = {
        mac1 = builtins.attrNames (spanningUnits "mac1");
        mac2 = builtins.attrNames (spanningUnits "mac2");
        rank1 = (spanningUnits "mac2").mtpstack-worker-big-rank1.environment;
        rank0 = (spanningUnits "mac1").mtpstack-worker-big.environment.MLX_RANK;
        restart = (spanningUnits "mac2").mtpstack-worker-big-rank1.serviceConfig.Restart;
      };
      expected = {
        mac1 = [ "mtpstack-proxy" "mtpstack-worker-big" ];
        mac2 = [ "mtpstack-worker-big-rank1" ];
        rank1 = {
          HF_HOME = "/var/lib/mtpstack/huggingface";
          HF_HUB_CACHE = "/var/lib/mtpstack/huggingface/hub";
          PYTHONUNBUFFERED = "1";
          MLX_RANK = "1";
          MLX_HOSTFILE = ''[["10.0.0.11:18101"],["10.0.0.12:18102"]]'';
        };
        rank0 = "0";
        restart = "always";
      };
    };
    everyRankOnOneMachineStartsAndStopsWithRankZero = {
      expr =
        let
          u = spanningUnits null;
        in
        {
          leaderWants = u.mtpstack-worker-big.wants;
          inherit (u.mtpstack-worker-big-rank1) bindsTo partOf;
          proxyWants = u.mtpstack-proxy.wants;
        };
      expected = {
        leaderWants = [ "mtpstack-worker-big-rank1.service" ];
        bindsTo = [ "mtpstack-worker-big.service" ];
        partOf = [ "mtpstack-worker-big.service" ];
        proxyWants = [ "mtpstack-worker-big.service" "mtpstack-worker-big-rank1.service" ];
      };
    };
    distributedArgvNamesBackendAndStrategy = {
      expr =
        let
          a = mtp.workerArgv spanning.workers.big;
        in
        builtins.genList (i: builtins.elemAt a (builtins.length a - 4 + i)) 4;
      expected = [ "--distributed-backend" "ring" "--distributed-strategy" "pipeline" ];
    };
    launchdRankDaemonCarriesTheEnvironment = {
      expr =
        let
          c =
            (mtp.launchd.daemons {
              config = spanning;
              configFile = "/c";
              binDir = "/pkg/bin";
              hostName = "mac2";
              writeText = inlineText;
            }).mtpstack-worker-big-rank1.serviceConfig;
        in
        {
          inherit (c) KeepAlive;
          rank = c.EnvironmentVariables.MLX_RANK;
          hostfile = c.EnvironmentVariables.MLX_HOSTFILE;
        };
      expected = {
        KeepAlive = true;
        rank = "1";
        hostfile = ''[["10.0.0.11:18101"],["10.0.0.12:18102"]]'';
      };
    };
    firewallAdmitsPeersToRankPorts = {
      expr = (mtp.firewall.rules {
        config = spanning;
        hostName = "mac2";
      }).nftables;
      expected = "ip saddr 10.0.0.11 tcp dport 18102 accept\n";
    };
    renderFillsDefaults = {
      expr = {
        inherit (fleet.proxy) port concurrencyLimit queue;
        inherit (fleet.workers.plain) model backend drafter host extraArgs;
      };
      expected = {
        port = 8080;
        concurrencyLimit = 1;
        queue = {
          maxWaiting = 16;
          timeoutSeconds = 30;
        };
        model = "plain";
        backend = "native";
        drafter = null;
        host = "127.0.0.1";
        extraArgs = [ ];
      };
    };
    renderFillsTheDrafterKind = {
      expr = fleet.workers.mtp.drafter;
      expected = {
        path = "/srv/models/drafter";
        bits = 6;
        depth = 3;
        kind = "auto";
        maxDepth = 4;
      };
    };
    renderKeepsPartialTimeouts = {
      expr = (mtp.render { proxy.timeouts.idleSeconds = 5; }).proxy.timeouts;
      expected = {
        connectSeconds = 5;
        firstByteSeconds = 300;
        idleSeconds = 5;
        clientSeconds = 30;
      };
    };
    gateFromModelLimit = {
      expr = mtp.coupling.gateFor fleet.proxy "qwen3.8-27b";
      expected = 2;
    };
    gateFallsBackToConcurrencyLimit = {
      expr = mtp.coupling.gateSource fleet.proxy "plain";
      expected = [ "proxy" "concurrencyLimit" ];
    };
    mismatchedNamesTheUncoupledWorker = {
      expr = mtp.coupling.mismatched fleet;
      expected = [ "plain" ];
    };
    matchedWideFleetPasses = {
      expr = mtp.coupling.mismatched (
        mtp.render {
          proxy.concurrencyLimit = 4;
          workers.w = worker "t" 4 1;
        }
      );
      expected = [ ];
    };
    assertionMessage = {
      expr = builtins.elemAt (mtp.assertions [ "services" "mtpstack" ] fleet) 1;
      expected = {
        assertion = false;
        message = "these two must agree: `services.mtpstack.workers.plain.maxNumSeqs` is 3 but `services.mtpstack.proxy.concurrencyLimit` is 1 (model `plain` has no entry in `services.mtpstack.proxy.modelConcurrencyLimits`); the proxy admits that many requests at once to each worker of model `plain`. Move them together, to the same value from 1 to 4; any matched pair is valid, with or without a drafter";
      };
    };
    badWorkerNameIsAsserted = {
      expr =
        (builtins.head (
          mtp.assertions [ "services" "mtpstack" ] (
            mtp.render {
              workers."a b" = worker "t" 1 1;
            }
          )
        )).assertion;
      expected = false;
    };
    optionPathQuotesDottedNames = {
      expr = mtp.optionPath [ "proxy" "modelConcurrencyLimits" "qwen3.8-27b" "it's" ];
      expected = ''proxy.modelConcurrencyLimits."qwen3.8-27b".it's'';
    };
    execArgEscaping = {
      expr = mtp.systemd.escapeExecArgs [ "/a b" "100%" "$HOME" ''q"uote'' "back\\slash" ];
      expected = ''"/a b" "100%%" "$$HOME" "q\"uote" "back\\slash"'';
    };
    workerExecStart = {
      expr = units.mtpstack-worker-mtp.serviceConfig.ExecStart;
      expected = ''"/pkg/bin/mtpstack" "worker" "--model" "/srv/models/target dir" "--target-bits" "4" "--draft-model" "/srv/models/drafter" "--drafter-bits" "6" "--draft-depth" "3" "--draft-kind" "auto" "--max-num-seqs" "2" "--prefix-cache-gib" "2" "--served-model-name" "qwen3.8-27b" "--host" "127.0.0.1" "--port" "8101"'';
    };
    workerEnvironmentHasNoPreload = {
      expr = units.mtpstack-worker-mtp.environment ? LD_PRELOAD;
      expected = false;
    };
    proxyNeedsItsWorkers = {
      expr = {
        inherit (units.mtpstack-proxy) wants;
        execStart = units.mtpstack-proxy.serviceConfig.ExecStart;
      };
      expected = {
        wants = [ "mtpstack-worker-mtp.service" "mtpstack-worker-plain.service" ];
        execStart = ''"/pkg/bin/mtpstack" "proxy" "--config" "/etc/mtpstack.json"'';
      };
    };
    editRestartsOnlyThatWorker = {
      expr = restartedBy edited;
      expected = {
        plain = true;
        mtp = false;
        proxy = false;
      };
    };
    portChangeRestartsTheProxyToo = {
      expr = restartedBy moved;
      expected = {
        plain = true;
        mtp = false;
        proxy = true;
      };
    };
    widthChangeRestartsTheProxy = {
      expr = (restartedBy widened).proxy;
      expected = true;
    };
    apiKeysAreCopiedAtStartAndOnReload = {
      expr =
        let
          withKeys = mtp.render { proxy.apiKeysFile = "/run/secrets/keys"; };
          proxyUnit =
            (mtp.systemd.units {
              config = withKeys;
              configFile = "/c";
              binDir = "/b";
              writeText = name: _: "/store/${name}";
              coreutilsBin = "/cu";
            }).mtpstack-proxy;
        in
        {
          inherit (proxyUnit.serviceConfig) ExecStartPre ExecReload RuntimeDirectory;
          credential = proxyUnit.serviceConfig ? LoadCredential;
          path = (mtp.systemd.runtimeConfig withKeys).proxy.apiKeysFile;
        };
      expected = {
        ExecStartPre = [ "+\"/bin/sh\" \"/store/mtpstack-proxy-copy-keys\" \"/run/secrets/keys\" \"/run/mtpstack-proxy\"" ];
        ExecReload = [
          "+\"/bin/sh\" \"/store/mtpstack-proxy-copy-keys\" \"/run/secrets/keys\" \"/run/mtpstack-proxy\""
          "/cu/kill -HUP $MAINPID"
        ];
        RuntimeDirectory = [ "mtpstack-proxy" ];
        credential = false;
        path = "/run/mtpstack-proxy/api-keys";
      };
    };
    tenantsReloadTheProxyAndRestartNothing = {
      expr =
        let
          unitsWith = tenants: unitsOf (mtp.render { inherit (fleet) workers; proxy = fleet.proxy // { inherit tenants; }; });
          before = unitsWith { };
          after = unitsWith { alice.weight = 2; };
        in
        {
          restart = before.mtpstack-proxy.restartTriggers == after.mtpstack-proxy.restartTriggers;
          reload = before.mtpstack-proxy.reloadTriggers == after.mtpstack-proxy.reloadTriggers;
          signal = before.mtpstack-proxy.serviceConfig.ExecReload;
        };
      expected = {
        restart = true;
        reload = false;
        signal = [ "/usr/bin/kill -HUP $MAINPID" ];
      };
    };
    launchdProgramArguments = {
      expr = daemons.mtpstack-worker-plain.serviceConfig.ProgramArguments;
      expected = [
        # nix-darwin's own wait for the store's volume, then the argv itself.
        "/bin/sh"
        "-c"
        "/bin/wait4path /nix/store && exec \"$@\""
        "mtpstack-worker-plain"
        "/pkg/bin/mtpstack"
        "worker"
        "--model"
        "mlx-community/plain"
        "--target-bits"
        "bf16"
        "--max-num-seqs"
        "3"
        "--prefix-cache-gib"
        "2"
        "--served-model-name"
        "plain"
        "--host"
        "127.0.0.1"
        "--port"
        "8102"
      ];
    };
  };

  failures = builtins.filter (t: t.expr != t.expected) (
    builtins.attrValues (builtins.mapAttrs (name: t: t // { inherit name; }) tests)
  );
in
map (t: { inherit (t) name expr expected; }) failures
