# The Python packages modules/package.nix takes at another version than the
# nixpkgs it is built with carries, each pinned by the hash of its file on
# PyPI, and the versions of nixpkgs' own packages this package was tested
# with. Data only (no nixpkgs), so tests read it with a bare `nix-instantiate`:
# tests/nix/test_package_drift.py checks it against requirements.lock and
# requirements-nixpkgs.lock (which `python -m devkit.nix_package` writes from
# it and requirements.lock).
#
# Hashes: `pip download --no-deps ...` then `nix hash file FILE`.
{
  # Every platform: worker/caches.py imports `normalize_qk` from
  # `mlx_lm.models.gated_delta`, which nixpkgs' mlx-lm 0.31.3 lacks. The sdist
  # (`pip download --no-deps --no-binary :all: mlx-lm==0.32.2`) carries the
  # tests, unlike a wheel.
  mlx-lm = {
    version = "0.32.2";
    hash = "sha256-GvipL2oUHD4r9bA2msRGQgOo4hicR7nkDT6SHls6H+k=";
    # The sdist's own test run (nixpkgs' pytestCheckHook) skips these, in
    # place of nixpkgs' list, which follows nixpkgs' own mlx-lm: the hook
    # aborts on a path with no `::` that matches no file of this sdist
    # (pkgs/development/interpreters/python/hooks/pytest-check-hook.sh), so
    # the list must be this version's. scripts/check-nix-pins checks that each
    # path matches. Taken from nixpkgs' mlx-lm 0.31.3 recipe:
    disabledTestPaths = [
      # Requires network access to huggingface.co
      "tests/test_datsets.py"
      "tests/test_generate.py"
      "tests/test_prompt_cache.py::TestPromptCache"
      "tests/test_server.py"
      "tests/test_tokenizers.py"
      "tests/test_utils.py::TestUtils::test_convert"
      "tests/test_utils.py::TestUtils::test_load"
      # RuntimeError: [metal_kernel] No GPU back-end.
      "tests/test_losses.py"
      "tests/test_models.py::TestModels::test_bitnet"
      # TypeError: 'NoneType' object is not callable
      "tests/test_models.py::TestModels::test_gated_delta"
      "tests/test_models.py::TestModels::test_gated_delta_masked"
      # New in 0.32: its model runs the Metal kernel `qk_norm_rope` ("[metal_kernel]
      # No Metal back-end" on a CPU build).
      "tests/test_muse_spark.py"
    ];
    # With an mlx older than 0.32 (nixpkgs' Linux mlx 0.31.2) these fail too,
    # so they are skipped there: mlx 0.31's `mx.fast.metal_kernel` raises on
    # a CPU build when `mlx_lm.kernels` is imported (a collection error, which
    # fails the build), and mlx-lm 0.32's sampler, compiled over
    # `mx.random.state`, repeats its draw in another thread (mlx_lm.server
    # samples in one: docs/nix.md).
    disabledTestPathsBelowMlx = {
      version = "0.32";
      paths = [
        "tests/test_kernels.py"
        "tests/test_sample_utils.py::TestSampleUtils::test_sampler_prng_across_threads"
      ];
    };
  };

  # aarch64-darwin: the Metal build, as nixpkgs' `mlx-bin` packages it
  # (pkgs/development/python-modules/mlx/bin.nix and metal.nix): one wheel of
  # `mlx` per Python version, and the Metal runtime `mlx-metal` beside it, each
  # in two macOS variants (modules/package.nix's `macosVariant`, named as
  # metal.nix names them). MLX's release workflow builds every wheel three
  # times, with deployment targets 14.0, 15.0 and 26.2
  # (.github/workflows/release.yml), and compiles its JACCL backend (RDMA over
  # Thunderbolt) into libmlx, which mlx-metal carries, only for 26.2 and later
  # (mlx/distributed/jaccl/CMakeLists.txt; below it `no_jaccl.cpp`, whose
  # `is_available()` is false): "14" runs on macOS 14 and later without
  # JACCL, "26" on macOS 26.2 and later with it.
  # `pip download --no-deps --only-binary :all: --platform macosx_14_0_arm64
  # --python-version 3.13 mlx==0.32.4` (and mlx-metal==0.32.4; `macosx_26_0_arm64`).
  mlx = {
    version = "0.32.4";
    wheels = {
      "14" = {
        platform = "macosx_14_0_arm64";
        hashes = {
          "3.12" = "sha256-/x175UdY6jqHW4/lTv8TvtF62VZlBeMB9deFG/hpaA8=";
          "3.13" = "sha256-xzdfLWrNjHL0E9AYJmrgY4fLnKqzH0dfP/HFYAp8tMU=";
          "3.14" = "sha256-8ebvRB4eLOVBWQIqj6VZf46k96zyeHUgScT3dLvQUB0=";
        };
      };
      "26" = {
        platform = "macosx_26_0_arm64";
        hashes = {
          "3.12" = "sha256-eSiGkHbbYmerPr2yU7LIC+HnOLMDLHgxcL0dWdRgxXg=";
          "3.13" = "sha256-7xMOPaiVyFN0sRpsOJrLEiiT8v/L7YJri2L9RaILetY=";
          "3.14" = "sha256-HdVkkbRKK/ohf2DaZqXJyImt162dwsvPUmOJ6jHYO+4=";
        };
      };
    };
  };
  mlx-metal = {
    version = "0.32.4";
    wheels = {
      "14" = {
        platform = "macosx_14_0_arm64";
        hash = "sha256-gBmy22IlmSZ9ZswWiy8Nv1r5KXkKbDs5E+AOq8QqeUc=";
        jaccl = false;
      };
      "26" = {
        platform = "macosx_26_0_arm64";
        hash = "sha256-UU35LUGiholdJWS0sY9NpFCWvXpKDEfhBC80WtWn+TY=";
        jaccl = true;
      };
    };
  };

  # Taken from nixpkgs unpinned, at least at these versions (the package
  # refuses an older mlx at evaluation; pyproject's bound refuses an older
  # llguidance at build time). requirements-nixpkgs.lock installs exactly
  # these, so CI runs the worker's and proxy's tests with them.
  nixpkgs = {
    # Linux: nixpkgs' source build. PyPI has no sdist of mlx and GitHub is
    # not reachable where these pins were made, so 0.32.4 cannot be pinned
    # from source; its Linux wheels bundle a reference BLAS.
    mlx = "0.31.2";
    # pyproject.toml's lower bound: nixpkgs carries 1.7.x.
    llguidance = "1.7.0";
  };
}
