# expect: concurrency-mismatch
# The proxy admits 4 at once to a worker that batches 1: the excess waits or
# turns into 429s. Move the two together instead.
{
  services.mtpstack = {
    enable = true;
    proxy.modelConcurrencyLimits."qwen3.8-27b" = 4;
    workers.qwen = {
      model = "qwen3.8-27b";
      target = {
        path = "mlx-community/Qwen3.8-27B-4bit";
        bits = 4;
      };
      maxNumSeqs = 1;
      port = 8101;
    };
  };
}
