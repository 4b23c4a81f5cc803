# Three models: one at width 4 through the default gate, one at width 3 with a
# drafter through its own gate, and an mlx_lm.server comparison worker with a
# drafter at width 1 (mlx_lm.server serves one request at a time with a draft
# model). Every width equals its model's gate.
{
  services.mtpstack = {
    enable = true;
    openFirewall = true;
    proxy = {
      host = "0.0.0.0";
      port = 8080;
      concurrencyLimit = 4;
      modelConcurrencyLimits = {
        "qwen3.8-27b" = 3;
        "qwen3.8-27b-mlx-lm" = 1;
      };
      queue = {
        maxWaiting = 32;
        timeoutSeconds = 12.5;
      };
      timeouts = {
        firstByteSeconds = 600;
        clientSeconds = 10; # clients on a LAN: a slow one is a broken one
      };
      apiKeysFile = "/run/secrets/mtpstack-api-keys";
    };
    policy.allowedBackends = [ "native" "mlx-lm" ];
    workers =
      let
        # The 27B with its MTP drafter, served by both backends below.
        qwen27b = {
          target = {
            path = "/srv/models/Qwen3.8-27B-4bit";
            bits = 4;
          };
          drafter = {
            path = "/srv/models/Qwen3.8-27B-MTP-6bit";
            bits = 6;
            depth = 2;
          };
        };
      in
      {
        small = {
          model = "qwen3-4b";
          target = {
            path = "/srv/models/Qwen3-4B-bf16";
            bits = "bf16";
          };
          maxNumSeqs = 4;
          port = 8101;
        };
        qwen-mtp = qwen27b // {
          model = "qwen3.8-27b";
          maxNumSeqs = 3;
          port = 8102;
        };
        qwen-mlx-lm = qwen27b // {
          model = "qwen3.8-27b-mlx-lm";
          backend = "mlx-lm";
          maxNumSeqs = 1;
          port = 8103;
          extraArgs = [ "--log-level" "INFO" ];
        };
      };
  };
}
