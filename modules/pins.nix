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
  };

  # aarch64-darwin: the Metal build, as nixpkgs' `mlx-bin` packages it
  # (pkgs/development/python-modules/mlx/bin.nix and metal.nix): one wheel of
  # `mlx` per Python version, and the Metal runtime `mlx-metal` beside it.
  # `pip download --no-deps --only-binary :all: --platform macosx_14_0_arm64
  # --python-version 3.13 mlx==0.32.4` (and mlx-metal==0.32.4).
  mlx = {
    version = "0.32.4";
    platform = "macosx_14_0_arm64";
    wheels = {
      "3.12" = "sha256-/x175UdY6jqHW4/lTv8TvtF62VZlBeMB9deFG/hpaA8=";
      "3.13" = "sha256-xzdfLWrNjHL0E9AYJmrgY4fLnKqzH0dfP/HFYAp8tMU=";
      "3.14" = "sha256-8ebvRB4eLOVBWQIqj6VZf46k96zyeHUgScT3dLvQUB0=";
    };
  };
  mlx-metal = {
    version = "0.32.4";
    # The macOS 14 build runs on macOS 14 and later (PyPI also has 15 and 26).
    platform = "macosx_14_0_arm64";
    hash = "sha256-gBmy22IlmSZ9ZswWiy8Nv1r5KXkKbDs5E+AOq8QqeUc=";
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
