# mtpstack as a Python application, from this repository's source, with
# nixpkgs' python3Packages.
{
  lib,
  stdenv,
  python3,
}:
let
  onAppleSilicon = stdenv.hostPlatform.isDarwin && stdenv.hostPlatform.isAarch64;

  # nixpkgs' source build of mlx has Metal off: on a Mac it imports and
  # silently runs on the CPU. The prebuilt wheel (mlx-bin, with mlx-metal)
  # runs on the GPU; mlx-lm must see the same mlx, so the whole package set
  # is overridden, not just this application's inputs.
  python = python3.override {
    self = python;
    packageOverrides =
      final: prev:
      lib.optionalAttrs onAppleSilicon {
        # A nixpkgs without mlx-bin still evaluates (a default config must),
        # with a warning naming the consequence.
        mlx =
          prev.mlx-bin or (lib.warn ''
            mtpstack: this nixpkgs has no `python3Packages.mlx-bin` (the Metal build of mlx), so workers on aarch64-darwin run mlx on the CPU only, many times slower

            hint: use a nixpkgs that carries pkgs/development/python-modules/mlx/bin.nix, or set `services.mtpstack.package` to a build with a Metal-enabled mlx; a running worker reports its device on /identity'' prev.mlx);
      };
  };
  ps = python.pkgs;

  # The repository minus what never belongs in a build.
  src = builtins.path {
    name = "mtpstack-source";
    path = ../.;
    filter =
      path: type:
      !(builtins.elem (baseNameOf path) [
        ".git"
        ".venv"
        ".hypothesis"
        ".pytest_cache"
        "__pycache__"
        "mtpstack.egg-info"
        "build"
        "result"
      ]);
  };
in
ps.buildPythonApplication {
  pname = "mtpstack";
  version = "0.1.0";
  pyproject = true;
  inherit src;

  build-system = [ ps.setuptools ];

  dependencies = with ps; [
    aiohttp
    huggingface-hub
    matplotlib
    mlx
    mlx-lm
    numpy
    prometheus-client
    pydantic
    pyyaml
    rich
    tokenizers
  ];

  # requirements.lock pins exact versions for the venv; nixpkgs decides here.
  pythonRelaxDeps = true;
  # `mlx[cpu]` names PyPI's CPU wheel on Linux; nixpkgs' mlx is the one to use.
  pythonRemoveDeps = [ "mlx" ];

  # Workers with `backend = "mlx-lm"` run mlx_lm.server from the same package.
  postInstall = ''
    ln -s ${ps.mlx-lm}/bin/mlx_lm.server $out/bin/mlx_lm.server
  '';

  # One import root: the component folders install as mtpstack.proxy, mtpstack.worker, ...
  pythonImportsCheck = [
    "mtpstack"
    "mtpstack.validator"
    "mtpstack.proxy"
  ];

  passthru = {
    inherit python;
    inherit (ps) mlx;
  };

  meta = {
    description = "Serve MLX models with multi-token-prediction speculative decoding across a fleet";
    license = lib.licenses.mit;
    mainProgram = "mtpstack";
    platforms = [
      "x86_64-linux"
      "aarch64-linux"
      "aarch64-darwin"
    ];
  };
}
