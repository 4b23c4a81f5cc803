# The least a fleet needs: one worker, no drafter, everything else defaulted.
# Its model name is its attribute name and its gate the default
# `proxy.concurrencyLimit` of 1.
{
  services.mtpstack = {
    enable = true;
    workers.qwen3-0_6b = {
      target = {
        path = "mlx-community/Qwen3-0.6B-8bit";
        bits = 8;
      };
      maxNumSeqs = 1;
      port = 8101;
    };
  };
}
