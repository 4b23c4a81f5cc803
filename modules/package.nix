# mtpstack as a Python application, from this repository's source, with
# nixpkgs' python3Packages: its dependencies are pyproject.toml's, mlx-lm (and
# on aarch64-darwin the Metal mlx) at the versions modules/pins.nix pins by
# hash, and the build imports every module a running worker, proxy and
# `mtpstack validate` import (modules/python-imports.json).
{
  lib,
  stdenv,
  python3,
  fetchPypi,
  # aarch64-darwin: which build of the Metal wheels (modules/pins.nix), named
  # as nixpkgs' mlx/metal.nix names them: "14" runs on macOS 14 and later,
  # "26" needs macOS 26.2 and carries MLX's JACCL backend (`passthru.jaccl`).
  # The modules take "26" on a host that runs a `jaccl` rank.
  macosVariant ? "14",
}:
let
  pins = import ./pins.nix;
  onAppleSilicon = stdenv.hostPlatform.isDarwin && stdenv.hostPlatform.isAarch64;
  variants = builtins.attrNames pins.mlx-metal.wheels;
  metalWheel =
    pins.mlx-metal.wheels.${macosVariant} or (throw ''
      mtpstack: modules/pins.nix pins the Metal wheels of mlx for the macOS variants ${lib.concatStringsSep ", " variants}, not `${toString macosVariant}`

      hint: pass `macosVariant` as one of ${lib.concatMapStringsSep ", " (v: "\"${v}\"") variants} to modules/package.nix'');
  mlxWheel = pins.mlx.wheels.${macosVariant};

  # mlx-lm's and mlx's versions matter beyond their bounds (worker/caches.py
  # imports `mlx_lm.models.gated_delta.normalize_qk`, new in mlx-lm 0.32), and
  # mlx-lm must see the same mlx as mtpstack: the whole package set is
  # overridden, not just this application's inputs.
  python = python3.override {
    self = python;
    packageOverrides = final: prev: {
      mlx-lm = prev.mlx-lm.overridePythonAttrs (old: {
        inherit (pins.mlx-lm) version;
        src = fetchPypi {
          pname = "mlx_lm";
          inherit (pins.mlx-lm) version hash;
        };
        # The sdist takes its version from PKG-INFO through setuptools-scm.
        build-system = (old.build-system or [ ]) ++ [ final.setuptools-scm ];
        # A dependency since 0.32 (nixpkgs' recipe has it for the tests only).
        dependencies = lib.unique ((old.dependencies or [ ]) ++ [ final.sentencepiece ]);
        # The pinned sdist's own list, not nixpkgs' (modules/pins.nix says why).
        disabledTestPaths =
          pins.mlx-lm.disabledTestPaths
          ++ lib.optionals (lib.versionOlder final.mlx.version pins.mlx-lm.disabledTestPathsBelowMlx.version)
            pins.mlx-lm.disabledTestPathsBelowMlx.paths;
        meta = old.meta // {
          changelog = "https://github.com/ml-explore/mlx-lm/releases/tag/v${pins.mlx-lm.version}";
        };
      });
    }
    // lib.optionalAttrs onAppleSilicon (
      if prev ? mlx-bin then
        {
          # The prebuilt wheels with the Metal runtime, as nixpkgs' mlx-bin
          # (pkgs/development/python-modules/mlx/bin.nix) packages them; the
          # source build has Metal off and would run on the CPU.
          mlx-metal = prev.mlx-metal.overridePythonAttrs (_: {
            inherit (pins.mlx-metal) version;
            src = fetchPypi {
              pname = "mlx_metal";
              inherit (pins.mlx-metal) version;
              inherit (metalWheel) platform hash;
              format = "wheel";
              dist = "py3";
              python = "py3";
              abi = "none";
            };
          });
          mlx-bin = prev.mlx-bin.overridePythonAttrs (
            let
              pythonVersion = python3.pythonVersion;
              dist = "cp${lib.replaceStrings [ "." ] [ "" ] pythonVersion}";
            in
            _: {
              inherit (pins.mlx) version;
              # bin.nix sets `disabled` unless its own wheel list has this
              # Python (3.13 and 3.14 at mlx 0.31.2): every Python pinned here
              # has its wheel, and one that is not fails below, naming the fix.
              disabled = false;
              src = fetchPypi {
                pname = "mlx";
                inherit (pins.mlx) version;
                inherit (mlxWheel) platform;
                inherit dist;
                python = dist;
                abi = dist;
                format = "wheel";
                hash =
                  mlxWheel.hashes.${pythonVersion} or (throw ''
                    mtpstack: modules/pins.nix pins the Metal wheel of mlx ${pins.mlx.version} (macOS variant ${macosVariant}) for Python ${lib.concatStringsSep ", " (builtins.attrNames mlxWheel.hashes)}, not for this nixpkgs' python3 (${pythonVersion})

                    hint: add its hash to `mlx.wheels."${macosVariant}".hashes` in modules/pins.nix (`pip download --no-deps --only-binary :all: --platform ${mlxWheel.platform} --python-version ${pythonVersion} mlx==${pins.mlx.version}`, then `nix hash file`), or set `services.mtpstack.package`'');
              };
            }
          );
          mlx = final.mlx-bin;
        }
      else
        {
          # A nixpkgs without mlx-bin still evaluates (a default config must),
          # with a warning naming the consequence.
          mlx = lib.warn ''
            mtpstack: this nixpkgs has no `python3Packages.mlx-bin` (the Metal build of mlx), so workers on aarch64-darwin run mlx on the CPU only, many times slower

            hint: use a nixpkgs that carries pkgs/development/python-modules/mlx/bin.nix, or set `services.mtpstack.package` to a build with a Metal-enabled mlx; a running worker reports its device on /identity'' prev.mlx;
        }
    );
  };
  ps = python.pkgs;

  # Elsewhere mlx is nixpkgs' source build, unpinned (modules/pins.nix says
  # why); CI tests the worker with the oldest version accepted here.
  checkedMlx =
    if onAppleSilicon || lib.versionAtLeast ps.mlx.version pins.nixpkgs.mlx then
      ps.mlx
    else
      throw ''
        mtpstack: this nixpkgs' mlx is ${ps.mlx.version}, older than ${pins.nixpkgs.mlx}, the oldest the worker is tested with (requirements-nixpkgs.lock)

        hint: use a newer nixpkgs, or set `services.mtpstack.package` to a build with mlx >= ${pins.nixpkgs.mlx}'';

  # pyproject.toml's `project.dependencies`, as nixpkgs attribute names (PEP
  # 503 names; extras and markers dropped: nixpkgs' mlx is the CPU build on
  # Linux and mlx-bin's override on aarch64-darwin).
  pyproject = builtins.fromTOML (builtins.readFile ../pyproject.toml);
  requirementName =
    requirement:
    lib.toLower (
      builtins.replaceStrings [ "_" "." ] [ "-" "-" ] (
        builtins.head (builtins.match "[[:space:]]*([A-Za-z0-9][A-Za-z0-9._-]*).*" requirement)
      )
    );
  dependencyNames = lib.unique (map requirementName pyproject.project.dependencies);
  dependency =
    name:
    if name == "mlx" then
      checkedMlx
    else
      ps.${name} or (throw ''
        mtpstack: pyproject.toml requires `${name}`, which this nixpkgs' python3Packages does not carry

        hint: package it in modules/package.nix's `packageOverrides`, or use a nixpkgs that has it'');

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

  dependencies = map dependency dependencyNames;

  # Workers with `backend = "mlx-lm"` run mlx_lm.server from the same package.
  postInstall = ''
    ln -s ${ps.mlx-lm}/bin/mlx_lm.server $out/bin/mlx_lm.server
  '';

  # What a running worker, proxy and `mtpstack validate` import, lazily
  # imported engine included: `python -m devkit.nix_package` derives it from
  # the source (tests/nix/test_package_drift.py keeps it current).
  pythonImportsCheck = lib.importJSON ./python-imports.json;

  passthru = {
    inherit python pins dependencyNames;
    inherit (ps) mlx mlx-lm;
    # Whether this build's mlx can run MLX's JACCL backend: the macOS 26
    # Metal wheels only (the modules refuse a `jaccl` rank on a host whose
    # package says false). The source build of mlx (Linux) has no JACCL.
    jaccl = onAppleSilicon && ps ? mlx-bin && metalWheel.jaccl;
    macosVariant = if onAppleSilicon then macosVariant else null;
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
