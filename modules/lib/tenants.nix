# The tenants' rules, the twin of `validator/rules.py`'s `check_tenants`
# (tested against it): a tenant's name as the keys file spells it, and a
# `maxConcurrent` the fleet can run at once (the sum of every worker's gate:
# a tenant may use every served model). Whether the keys file names each
# tenant is checked where the file is: by the proxy at start and on reload
# (`systemctl reload`), never at evaluation (the file stays out of the store).
let
  coupling = import ./coupling.nix;
  optionPath = import ./option-path.nix;

  fleetWidth =
    config:
    builtins.foldl' (n: w: n + coupling.gateFor config.proxy w.model) 0 (builtins.attrValues config.workers);

  # Names of the tenants whose maxConcurrent exceeds the fleet's width, sorted.
  beyondFleet =
    config:
    builtins.filter (
      name:
      let
        m = config.proxy.tenants.${name}.maxConcurrent;
      in
      m != null && m > fleetWidth config
    ) (builtins.attrNames config.proxy.tenants);

  badNames =
    config:
    builtins.filter (name: builtins.match "[A-Za-z0-9_.-]{1,64}" name == null) (
      builtins.attrNames config.proxy.tenants
    );

  assertions =
    prefix: config:
    map (name: {
      assertion = false;
      message =
        "tenant `${name}` may have ${toString config.proxy.tenants.${name}.maxConcurrent} requests in flight, but the fleet's"
        + " workers admit ${toString (fleetWidth config)} at once in all (the sum of their gates): lower `${
          optionPath (prefix ++ [ "proxy" "tenants" name "maxConcurrent" ])
        }` to at most ${toString (fleetWidth config)}, or set it to null for no limit";
    }) (beyondFleet config)
    ++ map (name: {
      assertion = false;
      message =
        "a tenant name may hold only letters, digits, `_`, `.` and `-` (1-64 characters), got: `${name}`"
        + " in `${optionPath (prefix ++ [ "proxy" "tenants" ])}`";
    }) (badNames config);
in
{
  inherit
    fleetWidth
    beyondFleet
    badNames
    assertions
    ;
}
