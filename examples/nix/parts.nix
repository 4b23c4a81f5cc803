# What the invalid examples under ./invalid share, so that each of them shows
# only what makes it invalid. Not an example itself (the fleets under ./valid
# spell everything out, for copying).
{
  # The 4-bit 27B at batch width 1, without a drafter.
  worker = {
    model = "qwen3.8-27b";
    target = {
      path = "mlx-community/Qwen3.8-27B-4bit";
      bits = 4;
    };
    maxNumSeqs = 1;
    port = 8101;
  };

  # Its MTP head, drafting three tokens ahead.
  drafter = {
    path = "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX";
    bits = 6;
    depth = 3;
  };

  # One 397B model across mac1 (which runs the proxy as well) and mac2, given
  # by `mac2Address`; `distributed` adds to the worker's `distributed` settings.
  acrossTwoMacs = mac2Address: distributed: {
    enable = true;
    hosts = {
      mac1.address = "10.0.0.11";
      mac2.address = mac2Address;
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
      } // distributed;
    };
  };
}
