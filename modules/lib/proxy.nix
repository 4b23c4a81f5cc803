# What the proxy's unit (NixOS) and daemon (nix-darwin) depend on. Input: a
# rendered config (see render.nix).
#
# The proxy reads the whole fleet file, at a path that stays put between
# generations (`configPath`, made by the modules' `environment.etc`), and is
# restarted only when its view changes: what it acts on. An edit of one
# worker's tuning (draft depth, context cap, prefix cache, extra arguments,
# bits, a host's memory) restarts that worker only; the proxy keeps its
# connections, its queues and its routing table (which worker holds which
# conversation's prefix).
let
  placement = import ./placement.nix;

  # `environment.etc` name and path of the fleet file.
  etcName = "mtpstack/fleet.json";
  configPath = "/etc/${etcName}";

  # Everything `mtpstack proxy` reads from the config after start-up: its own
  # section, and per worker the model it serves, its backend (mlx-lm's
  # refusals and model rewrite), the address and port it dials, the batch
  # width it checks against the gate, and the weights (target, drafter, kind)
  # its fleet status compares with the worker's /identity. Not the draft
  # depths: they are the worker's own tuning, which the fleet status does not
  # hold against the proxy's copy of the config (proxy/fleet.py,
  # `weights_check`). tests/nix/test_restarts.py holds the proxy to this list.
  view = config: {
    # Not the tenants: a change of theirs reloads the proxy (SIGHUP), see `reloadView`.
    proxy = builtins.removeAttrs config.proxy [ "tenants" ];
    workers = builtins.mapAttrs (name: w: {
      inherit (w) model backend maxNumSeqs port;
      dial = placement.dialHost config name;
      target = w.target.path;
      drafter = if w.drafter == null then null else { inherit (w.drafter) path kind; };
    }) config.workers;
  };

  # What the proxy re-reads on a reload (SIGHUP: `systemctl reload`, or
  # `launchctl kill HUP` on nix-darwin) without dropping its connections,
  # queues or routing: the tenants (and the keys file, which is no option).
  reloadView = config: { inherit (config.proxy) tenants; };

  # How long the service manager waits for the proxy to stop before it kills
  # it: the grace in-flight requests get, plus 10 s for the rest of its exit.
  stopTimeoutSeconds = config: builtins.ceil config.proxy.shutdownGraceSeconds + 10;
in
{
  inherit
    etcName
    configPath
    view
    reloadView
    stopTimeoutSeconds
    ;
}
