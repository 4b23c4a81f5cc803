# expect: mlx-lm-cannot-load-mtp
# The bundled-MTP worker of ../valid/bundled-mtp.nix on mlx_lm.server: its
# drafter's path is the target's own, the MTP head bundled in its checkpoint,
# which mlx_lm.server cannot load (it loads draft models only).
let
  bundled = (import ../valid/bundled-mtp.nix).services.mtpstack.workers.qwen35-bundled;
in
{
  services.mtpstack = {
    enable = true;
    policy.allowedBackends = [ "mlx-lm" ];
    workers.qwen35 = bundled // {
      backend = "mlx-lm";
      maxNumSeqs = 1;
      # Not declared `mtp`: the path alone gives the head away.
      drafter = bundled.drafter // {
        kind = "auto";
      };
    };
  };
}
