# expect: worker-unreachable
# The worker runs on mac1 but listens on loopback only: the proxy on the
# gateway, dialling 10.0.0.11:8101, can never reach it.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = {
    enable = true;
    hosts = {
      gateway.address = "10.0.0.1";
      mac1.address = "10.0.0.11";
    };
    proxy.deployOn = "gateway";
    workers.qwen = parts.worker // {
      deployOn = "mac1";
      host = "127.0.0.1";
    };
  };
}
