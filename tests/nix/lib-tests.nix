# Unit tests of the pure functions in modules/lib, `builtins` only: evaluates
# to the list of failures ([] when all pass). Run by tests/nix (pytest) and by
# the flake's `checks`.
let
  mtp = import ../../modules/lib;

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

  units = mtp.systemd.units {
    config = fleet;
    configFile = "/etc/mtpstack.json";
    binDir = "/pkg/bin";
  };

  daemons = mtp.launchd.daemons {
    config = fleet;
    configFile = "/etc/mtpstack.json";
    binDir = "/pkg/bin";
  };

  # A worker's edit changes its own trigger and the proxy's only when it
  # touches a width.
  edited = mtp.render {
    inherit (fleet) proxy;
    workers = fleet.workers // {
      plain = fleet.workers.plain // {
        port = 8103;
      };
    };
  };
  editedUnits = mtp.systemd.units {
    config = edited;
    configFile = "/etc/mtpstack.json";
    binDir = "/pkg/bin";
  };
  widened = mtp.render {
    inherit (fleet) proxy;
    workers = fleet.workers // {
      plain = fleet.workers.plain // {
        maxNumSeqs = 4;
      };
    };
  };
  widenedUnits = mtp.systemd.units {
    config = widened;
    configFile = "/etc/mtpstack.json";
    binDir = "/pkg/bin";
  };

  tests = {
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
          workers.w = {
            target = {
              path = "t";
              bits = 4;
            };
            maxNumSeqs = 4;
            port = 1;
          };
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
              workers."a b" = {
                target = {
                  path = "t";
                  bits = 4;
                };
                maxNumSeqs = 1;
                port = 1;
              };
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
      expr = {
        plain = editedUnits.mtpstack-worker-plain.restartTriggers != units.mtpstack-worker-plain.restartTriggers;
        mtp = editedUnits.mtpstack-worker-mtp.restartTriggers != units.mtpstack-worker-mtp.restartTriggers;
        proxy = editedUnits.mtpstack-proxy.restartTriggers != units.mtpstack-proxy.restartTriggers;
      };
      expected = {
        plain = true;
        mtp = false;
        proxy = false;
      };
    };
    widthChangeRestartsTheProxy = {
      expr = widenedUnits.mtpstack-proxy.restartTriggers != units.mtpstack-proxy.restartTriggers;
      expected = true;
    };
    apiKeysBecomeACredential = {
      expr =
        let
          withKeys = mtp.render { proxy.apiKeysFile = "/run/secrets/keys"; };
          proxyUnit =
            (mtp.systemd.units {
              config = withKeys;
              configFile = "/c";
              binDir = "/b";
            }).mtpstack-proxy;
        in
        {
          credential = proxyUnit.serviceConfig.LoadCredential;
          path = (mtp.systemd.runtimeConfig withKeys).proxy.apiKeysFile;
        };
      expected = {
        credential = [ "api-keys:/run/secrets/keys" ];
        path = "/run/credentials/mtpstack-proxy.service/api-keys";
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
