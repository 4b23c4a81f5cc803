# expect: backend-forbidden
# An mlx-lm worker in a fleet whose policy allows only the native backend.
{
  services.mtpstack = {
    enable = true;
    workers.qwen = {
      model = "qwen3.8-27b";
      backend = "mlx-lm";
      target = {
        path = "mlx-community/Qwen3.8-27B-4bit";
        bits = 4;
      };
      maxNumSeqs = 1;
      port = 8101;
    };
  };
}
