# A stand-in for nixpkgs' `python3`, enough to evaluate modules/package.nix
# with nixpkgs' `lib` alone: `override { self, packageOverrides }` applies the
# overrides to a set of packages that are plain attrsets ({ pname, version }
# plus `overridePythonAttrs`), and `buildPythonApplication` returns its
# arguments for the test to read. Used by tests/nix/test_package.py.
{
  lib,
  # nixpkgs' own versions of the packages the package overrides or checks.
  mlxVersion ? "0.31.2",
  mlxLmVersion ? "0.31.3",
  pythonVersion ? "3.13",
  # Whether this nixpkgs carries mlx-bin and mlx-metal (aarch64-darwin).
  withBin ? true,
  # Attribute names this nixpkgs lacks.
  missing ? [ ],
}:
let
  package =
    pname: version: extra:
    let
      self = {
        inherit pname version;
        meta = { };
        overridePythonAttrs = f: self // (if builtins.isFunction f then f self else f);
      }
      // extra;
    in
    self;
  names = [
    "aiohttp"
    "huggingface-hub"
    "llguidance"
    "matplotlib"
    "numpy"
    "prometheus-client"
    "pydantic"
    "pyyaml"
    "rich"
    "sentencepiece"
    "setuptools"
    "setuptools-scm"
    "tokenizers"
    "uvloop"
  ];
  base =
    lib.genAttrs names (n: package n "0" { })
    // {
      mlx = package "mlx" mlxVersion { };
      mlx-lm = package "mlx-lm" mlxLmVersion {
        dependencies = [ "mlx" ];
        disabledTestPaths = [ "tests/test_losses.py" ];
      };
    }
    // lib.optionalAttrs withBin {
      # As pkgs/development/python-modules/mlx/bin.nix: `disabled` unless its
      # own wheel list (3.13 and 3.14 at mlx 0.31.2) has this Python.
      mlx-bin = package "mlx-bin" "0.32.0" {
        disabled = !(builtins.elem pythonVersion [ "3.13" "3.14" ]);
      };
      mlx-metal = package "mlx-metal" "0.32.0" { };
    };
  available = builtins.removeAttrs base missing;
in
{
  inherit pythonVersion;
  override =
    { self, packageOverrides }:
    let
      final = available // packageOverrides final available;
    in
    {
      pkgs = final // {
        buildPythonApplication = args: args;
      };
    };
}
