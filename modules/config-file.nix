# The rendered config as a file in the store; with `checkConfig` on, built
# only if `mtpstack validate` accepts it.
{
  pkgs,
  cfg,
  contents,
}:
let
  raw = pkgs.writeText "mtpstack.json" (builtins.toJSON contents);
in
if !cfg.checkConfig then
  raw
else
  pkgs.runCommand "mtpstack-checked.json"
    {
      nativeBuildInputs = [ cfg.package ];
      preferLocalBuild = true;
    }
    ''
      if ! mtpstack validate ${raw} >&2; then
        echo >&2
        echo "error: the fleet config rendered from \`services.mtpstack\` failed \`mtpstack validate\` (paths above are relative to \`services.mtpstack\`)" >&2
        echo >&2
        echo "hint: fix the options named above, or set \`services.mtpstack.checkConfig = false\` to skip this check" >&2
        exit 1
      fi
      cp ${raw} $out
    ''
