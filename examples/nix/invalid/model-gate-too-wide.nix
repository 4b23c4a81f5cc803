# expect: concurrency-mismatch
# The proxy admits 4 at once to a worker that batches 1: the excess waits or
# turns into 429s. Move the two together instead.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = {
    enable = true;
    proxy.modelConcurrencyLimits."qwen3.8-27b" = 4;
    workers.qwen = parts.worker;
  };
}
