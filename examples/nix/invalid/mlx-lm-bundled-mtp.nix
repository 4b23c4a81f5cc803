# expect: mlx-lm-cannot-load-mtp
# The drafter's path is the target's own: the MTP head bundled in its
# checkpoint, which mlx_lm.server cannot load (it loads draft models only).
{
  services.mtpstack = {
    enable = true;
    policy.allowedBackends = [ "mlx-lm" ];
    workers.qwen35 = {
      model = "qwen3.5-9b";
      backend = "mlx-lm";
      target = {
        path = "/srv/models/Qwen3.5-9B";
        bits = "bf16";
      };
      drafter = {
        path = "/srv/models/Qwen3.5-9B";
        bits = "bf16";
        depth = 2;
      };
      maxNumSeqs = 1;
      port = 8101;
    };
  };
}
