# Module settings -> the config file's contents (the validator's camelCase
# shape with every default filled in). Values are passed through unchecked:
# range and type errors are the module types' and `mtpstack validate`'s job.
let
  defaults = import ./defaults.nix;

  # Only the config file's own sections; module-only options (enable,
  # package, checkConfig, openFirewall) are dropped.
  render =
    settings:
    let
      proxy = settings.proxy or { };
      workers = settings.workers or { };
    in
    {
      proxy =
        defaults.proxy
        // proxy
        // {
          queue = defaults.proxy.queue // (proxy.queue or { });
          timeouts = defaults.proxy.timeouts // (proxy.timeouts or { });
          tenants = builtins.mapAttrs (_: t: defaults.tenant // t) (proxy.tenants or { });
        };
      policy = defaults.policy // (settings.policy or { });
      workers = builtins.mapAttrs renderWorker workers;
      hosts = builtins.mapAttrs (_: host: defaults.host // host) (settings.hosts or { });
    };

  # A worker's served model name defaults to its attribute name; a drafter,
  # when set, gets its own defaults.
  renderWorker =
    name: worker:
    let
      drafter = worker.drafter or null;
      distributed = worker.distributed or null;
    in
    defaults.worker
    // { model = name; }
    // worker
    // {
      drafter = if drafter == null then null else defaults.drafter // drafter;
      distributed = if distributed == null then null else defaults.distributed // distributed;
      prefixCache = defaults.worker.prefixCache // (worker.prefixCache or { });
    };
in
{
  inherit render renderWorker;
}
