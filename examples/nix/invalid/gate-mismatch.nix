# expect: concurrency-mismatch
# The worker batches 2 but the proxy's gate for its model is the default
# `concurrencyLimit` of 1: half of the worker's width is never used. The module
# refuses this at evaluation time; `mtpstack validate` at build time.
{
  services.mtpstack = {
    enable = true;
    workers.qwen-mtp = {
      model = "qwen3.8-27b";
      target = {
        path = "mlx-community/Qwen3.8-27B-4bit";
        bits = 4;
      };
      drafter = {
        path = "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX";
        bits = 6;
        depth = 3;
      };
      maxNumSeqs = 2;
      port = 8101;
    };
  };
}
