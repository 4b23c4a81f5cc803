# expect: port-conflict
# A worker on the proxy's own port.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = {
    enable = true;
    workers.qwen = parts.worker // {
      port = 8080;
    };
  };
}
