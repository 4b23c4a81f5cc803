# expect: port-conflict
# A worker on the proxy's own port.
{
  services.mtpstack = {
    enable = true;
    workers.qwen = {
      model = "qwen3.8-27b";
      target = {
        path = "mlx-community/Qwen3.8-27B-4bit";
        bits = 4;
      };
      maxNumSeqs = 1;
      port = 8080;
    };
  };
}
