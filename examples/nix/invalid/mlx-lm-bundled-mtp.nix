# expect: mlx-lm-cannot-load-mtp
# The bundled-MTP worker of ../valid/bundled-mtp.nix on mlx_lm.server: its
# drafter's path is the target's own, the MTP head bundled in its checkpoint,
# which mlx_lm.server cannot load (it loads draft models only).
let
  valid = (import ../valid/bundled-mtp.nix).services.mtpstack;
in
{
  services.mtpstack = {
    enable = true;
    policy.allowedBackends = [ "mlx-lm" ];
    workers.qwen35 = valid.workers.qwen35-bundled // {
      backend = "mlx-lm";
      maxNumSeqs = 1;
    };
  };
}
