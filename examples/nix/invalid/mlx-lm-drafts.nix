# expect: mlx-lm-serializes-drafts
# Gate and width agree (2), but mlx_lm.server serves one request at a time once
# a draft model is loaded, so its real width is 1.
{
  services.mtpstack = {
    enable = true;
    proxy.concurrencyLimit = 2;
    policy.allowedBackends = [ "mlx-lm" ];
    workers.qwen = {
      model = "qwen3.8-27b";
      backend = "mlx-lm";
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
