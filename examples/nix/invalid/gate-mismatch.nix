# expect: concurrency-mismatch
# The worker batches 2 but the proxy's gate for its model is the default
# `concurrencyLimit` of 1: half of the worker's width is never used. The module
# refuses this at evaluation time; `mtpstack validate` at build time.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = {
    enable = true;
    workers.qwen-mtp = parts.worker // {
      inherit (parts) drafter;
      maxNumSeqs = 2;
    };
  };
}
