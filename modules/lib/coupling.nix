# The coupling rule, the twin of `validator/coupling.py` (tested against it):
# a worker's batch width `maxNumSeqs` must equal the proxy's admission gate for
# its model, `proxy.modelConcurrencyLimits.<model>`, else
# `proxy.concurrencyLimit`. A coupling, not a cap: 2, 3 or 4 on both sides is
# as valid as 1. Input: a rendered config (see render.nix).
let
  defaults = import ./defaults.nix;
  optionPath = import ./option-path.nix;

  gateFor = proxy: model: proxy.modelConcurrencyLimits.${model} or proxy.concurrencyLimit;

  # The config path that sets the gate for `model`.
  gateSource =
    proxy: model:
    if proxy.modelConcurrencyLimits ? ${model} then
      [ "proxy" "modelConcurrencyLimits" model ]
    else
      [ "proxy" "concurrencyLimit" ];

  isCoupled = proxy: worker: worker.maxNumSeqs == gateFor proxy worker.model;

  # Names of the workers whose width differs from their gate, sorted.
  mismatched =
    config:
    builtins.filter (name: !(isCoupled config.proxy config.workers.${name})) (
      builtins.attrNames config.workers
    );

  message =
    prefix: config: name:
    let
      worker = config.workers.${name};
      gate = gateFor config.proxy worker.model;
      source = gateSource config.proxy worker.model;
      widthOption = optionPath (prefix ++ [ "workers" name "maxNumSeqs" ]);
      gateOption = optionPath (prefix ++ source);
      limitsOption = optionPath (prefix ++ [ "proxy" "modelConcurrencyLimits" ]);
      why =
        if builtins.length source == 2 then
          " (model `${worker.model}` has no entry in `${limitsOption}`)"
        else
          "";
    in
    "these two must agree: `${widthOption}` is ${toString worker.maxNumSeqs}"
    + " but `${gateOption}` is ${toString gate}${why};"
    + " the proxy admits that many requests at once to each worker of model `${worker.model}`."
    + " Move them together, to the same value from ${toString defaults.widthMin} to ${toString defaults.widthMax};"
    + " any matched pair is valid, with or without a drafter";

  # One NixOS-style assertion per worker. `prefix` is the option path of the
  # module, e.g. [ "services" "mtpstack" ].
  assertions =
    prefix: config:
    map (name: {
      assertion = isCoupled config.proxy config.workers.${name};
      message = message prefix config name;
    }) (builtins.attrNames config.workers);
in
{
  inherit
    gateFor
    gateSource
    isCoupled
    mismatched
    assertions
    ;
}
