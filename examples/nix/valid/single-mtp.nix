# One model served by one worker with its MTP drafter at batch width 2; the
# proxy's gate for the model is 2 as well. The Nix twin of
# examples/valid/fleet.yaml.
{
  services.mtpstack = {
    enable = true;
    proxy.modelConcurrencyLimits."qwen3.8-27b" = 2;
    workers.qwen-mtp = {
      model = "qwen3.8-27b";
      target = {
        path = "mlx-community/Qwen3.8-27B-4bit";
        bits = 4;
      };
      drafter = {
        path = "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX";
        bits = 6;
        depth = "auto";
      };
      maxNumSeqs = 2;
      port = 8101;
    };
  };
}
