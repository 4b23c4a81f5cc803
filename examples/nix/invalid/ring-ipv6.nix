# expect: distributed-needs-ip
# One model across two hosts over MLX's ring, one of them given by its IPv6
# address: the ring splits `address:port` at the first colon and opens IPv4
# sockets, so `fd00::12:18101` can never be dialled.
{
  services.mtpstack = {
    enable = true;
    hosts = {
      mac1.address = "10.0.0.11";
      mac2.address = "fd00::12";
    };
    proxy.deployOn = "mac1";
    workers.big = {
      target = {
        path = "mlx-community/Qwen3.5-397B-A17B-4bit";
        bits = 4;
      };
      maxNumSeqs = 1;
      host = "0.0.0.0";
      port = 8101;
      prefixCache.maxGiB = 0;
      distributed.hosts = [ "mac1" "mac2" ];
    };
  };
}
