# expect: backend-forbidden
# An mlx-lm worker in a fleet whose policy allows only the native backend.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = {
    enable = true;
    workers.qwen = parts.worker // {
      backend = "mlx-lm";
    };
  };
}
