# mtpstack's pure Nix logic: plain attrsets in, plain data out, `builtins`
# only, so all of it evaluates (and is tested) without nixpkgs. The NixOS and
# nix-darwin modules declare options and call these.
let
  render = import ./render.nix;
  argv = import ./argv.nix;
  coupling = import ./coupling.nix;
  systemd = import ./systemd.nix;
  launchd = import ./launchd.nix;
  placement = import ./placement.nix;
  firewall = import ./firewall.nix;
  distributed = import ./distributed.nix;
  proxy = import ./proxy.nix;
  tenants = import ./tenants.nix;
in
{
  defaults = import ./defaults.nix;
  optionPath = import ./option-path.nix;
  inherit (render) render;
  inherit (argv) workerArgv proxyArgv resolve;
  inherit
    coupling
    systemd
    launchd
    placement
    firewall
    distributed
    proxy
    tenants
    ;

  # Every check the modules assert, as NixOS-style { assertion, message }.
  # `prefix` is the module's option path, e.g. [ "services" "mtpstack" ].
  assertions =
    prefix: config:
    let
      optionPath = import ./option-path.nix;
      badNames = builtins.filter (name: builtins.match "[A-Za-z0-9_.:-]+" name == null) (
        builtins.attrNames config.workers
      );
    in
    map (name: {
      assertion = false;
      message =
        "worker names become unit names, so they may hold only letters, digits and `_.:-`, got: `${name}`"
        + " in `${optionPath (prefix ++ [ "workers" ])}`";
    }) badNames
    ++ coupling.assertions prefix config
    ++ tenants.assertions prefix config
    ++ map (e: {
      assertion = false;
      inherit (e) message;
    }) (placement.errors prefix config);
}
