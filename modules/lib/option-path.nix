# [ "services" "mtpstack" "proxy" "modelConcurrencyLimits" "qwen3.8-27b" ] ->
# services.mtpstack.proxy.modelConcurrencyLimits."qwen3.8-27b", quoting names
# that are not Nix identifiers, as nixpkgs' error messages print option paths.
let
  isIdentifier = name: builtins.match "[a-zA-Z_][a-zA-Z0-9_'-]*" name != null;
  showPart = name: if isIdentifier name then name else builtins.toJSON name;
in
path: builtins.concatStringsSep "." (map showPart path)
