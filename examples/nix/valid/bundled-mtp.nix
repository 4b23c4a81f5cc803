# An original checkpoint that carries its MTP head as `mtp.*` tensors: the
# drafter's path is the target's own, so the head is loaded from the same
# files (kind `mtp`, which `auto` would detect as well). Beside it, a worker
# whose drafter is a separate small model, declared as such.
{
  services.mtpstack = {
    enable = true;
    proxy.modelConcurrencyLimits."qwen3.5-9b" = 2;
    workers = {
      qwen35-bundled = {
        model = "qwen3.5-9b";
        target = {
          path = "/srv/models/Qwen3.5-9B";
          bits = "bf16";
        };
        drafter = {
          path = "/srv/models/Qwen3.5-9B";
          bits = "bf16";
          depth = "auto";
          kind = "mtp";
        };
        maxNumSeqs = 2;
        port = 8101;
      };
      qwen3-small-drafter = {
        model = "qwen3-8b";
        target = {
          path = "/srv/models/Qwen3-8B-4bit";
          bits = 4;
        };
        drafter = {
          path = "/srv/models/Qwen3-0.6B-8bit";
          bits = 8;
          depth = 3;
          kind = "model";
        };
        maxNumSeqs = 1;
        port = 8102;
      };
    };
  };
}
