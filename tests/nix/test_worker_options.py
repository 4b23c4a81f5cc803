"""The Nix worker options (`modules/worker-options.nix`, evaluated with nixpkgs' `lib`) and `argv.nix`
against the settings table (`mtpstack.validator.WORKER_SETTINGS`) and the config model: the same
fields, the same choices, the same defaults, the same flags. Nix cannot import the table, so this
is where a setting added on one side only fails."""

from __future__ import annotations

import json
import re

import pytest

from mtpstack.validator import WORKER_SETTINGS, WorkerProfile, profile_paths

pytestmark = [pytest.mark.nix, pytest.mark.nixpkgs_lib]

#: A worker with its optional sections present, so that their defaults are filled too.
WORKER = {
    "target": {"path": "t", "bits": 4},
    "maxNumSeqs": 1,
    "port": 1,
    "drafter": {"path": "d", "bits": 6, "depth": 3},
    "distributed": {"hosts": ["a", "b"]},
}


@pytest.fixture(scope="module")
def worker_options(nixh, nixpkgs_lib) -> dict:
    """The worker submodule alone: its options (name and type, submodules opened) and its values for `WORKER`."""
    return nixh.eval(f"""
        let
          lib = import {nixpkgs_lib};
          eval = lib.evalModules {{
            modules = [
              {nixh.root / "modules" / "worker-options.nix"}
              ({{ _module.args.name = "w"; }} // builtins.fromJSON {nixh.string(json.dumps(WORKER))})
            ];
          }};
          shown = builtins.filter (o: o.visible && !o.internal) (lib.optionAttrSetToDocList eval.options);
        in {{
          options = builtins.listToAttrs (map (o: {{ inherit (o) name; value = o.type; }}) shown);
          config = removeAttrs eval.config [ "_module" ];
        }}
    """)


def leaf_options(options: dict[str, str]) -> dict[str, str]:
    """The options that hold a value, not a section (`drafter`, `distributed`: `null or (submodule)`)."""
    return {name: t for name, t in options.items() if "(submodule)" not in t and not name.startswith("_module.")}


def test_the_worker_options_are_the_config_models_fields_one_for_one(worker_options):
    assert set(leaf_options(worker_options["options"])) == set(profile_paths())


def test_every_setting_a_config_sets_is_a_nix_option_with_the_tables_choices(worker_options):
    options = worker_options["options"]
    for s in WORKER_SETTINGS:
        if s.config is None:
            continue
        assert s.config in options, s.flag
        if s.choices is not None:
            assert options[s.config] == "one of " + ", ".join(json.dumps(c) for c in s.choices), s.flag


def test_the_nix_defaults_are_the_config_models_and_the_tables(worker_options):
    nix = worker_options["config"]
    python = WorkerProfile.model_validate({**WORKER, "model": "w"}).model_dump(by_alias=True, mode="json")
    # The one default the modules set apart: the disk tier lives in the worker's state directory.
    assert nix["prefixCache"].pop("dir") == "/var/lib/mtpstack/workers/w/prefix-cache"
    assert python["prefixCache"].pop("dir") is None
    assert nix == python
    paths = profile_paths()
    for s in WORKER_SETTINGS:
        if s.config is None or paths[s.config].is_required() or s.name in ("distributed_backend", "prefix_cache_dir"):
            continue
        value = nix
        for key in s.config.split("."):
            value = value[key]
        assert value == s.default, s.flag


def test_an_mlx_lm_worker_has_no_disk_tier_by_default(nixh, nixpkgs_lib):
    config = nixh.eval(f"""
        let lib = import {nixpkgs_lib}; in
        (lib.evalModules {{ modules = [ {nixh.root / "modules" / "worker-options.nix"}
          {{ _module.args.name = "w"; target = {{ path = "t"; bits = 4; }}; maxNumSeqs = 1; port = 1; backend = "mlx-lm"; }} ]; }}
        ).config.prefixCache
    """)
    assert config == {"maxGiB": 2, "diskGiB": 32, "dir": None}


def test_argv_nix_renders_exactly_the_tables_flags_for_the_native_worker(nixh):
    text = (nixh.lib / "argv.nix").read_text()
    native = text[: text.index("mlxLmArgv =")]  # the native worker's part, its depth map's included
    assert set(re.findall(r'"(--[a-z-]+)"', native)) == {s.flag for s in WORKER_SETTINGS if s.config}
