# expect: distributed-ibv-devices
# One model across two Macs over JACCL (RDMA over Thunderbolt 5), without
# the RDMA devices that connect them: JACCL reads them from the file
# MLX_IBV_DEVICES names, and takes the group's size from it.
{
  services.mtpstack = {
    enable = true;
    hosts = {
      mac1.address = "10.0.0.11";
      mac2.address = "10.0.0.12";
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
      distributed = {
        hosts = [ "mac1" "mac2" ];
        backend = "jaccl";
        # What it needs: [ [ null "rdma_en2" ] [ "rdma_en2" null ] ]
      };
    };
  };
}
