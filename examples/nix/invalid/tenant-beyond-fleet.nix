# expect: tenant-beyond-fleet
# A tenant may have 3 requests in flight, but the fleet's one worker admits 1
# at once: the limit could never bind. The module refuses this at evaluation
# time (modules/lib/tenants.nix); `mtpstack validate` at build time.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = {
    enable = true;
    workers.qwen-mtp = parts.worker // {
      inherit (parts) drafter;
    };
    proxy.tenants.ci.maxConcurrent = 3;
  };
}
