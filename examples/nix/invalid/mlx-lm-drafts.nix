# expect: mlx-lm-serializes-drafts
# Gate and width agree (2), but mlx_lm.server serves one request at a time once
# a draft model is loaded, so its real width is 1.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = {
    enable = true;
    proxy.concurrencyLimit = 2;
    policy.allowedBackends = [ "mlx-lm" ];
    workers.qwen = parts.worker // {
      backend = "mlx-lm";
      inherit (parts) drafter;
      maxNumSeqs = 2;
    };
  };
}
