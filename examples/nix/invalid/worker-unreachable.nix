# expect: worker-unreachable
# The worker runs on mac1 but listens on loopback only: the proxy on the
# gateway, dialling 10.0.0.11:8101, can never reach it.
{
  services.mtpstack = {
    enable = true;
    hosts = {
      gateway.address = "10.0.0.1";
      mac1.address = "10.0.0.11";
    };
    proxy.deployOn = "gateway";
    workers.qwen = {
      deployOn = "mac1";
      target = {
        path = "mlx-community/Qwen3.8-27B-4bit";
        bits = 4;
      };
      maxNumSeqs = 1;
      host = "127.0.0.1";
      port = 8101;
    };
  };
}
