"""The settings table (`mtpstack.validator.WORKER_SETTINGS`) is what the worker's parser reads, what
`worker_argv` renders and what `WorkerConfig` holds: a setting declared once, seen the same everywhere."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import typing

import pytest

from mtpstack.cli import build_parser
from mtpstack.validator import SETTINGS, WORKER_SETTINGS, WorkerProfile, profile_paths, worker_argv
from mtpstack.validator import config as model
from mtpstack.worker.cli import register
from mtpstack.worker.config import WorkerConfig

#: A profile that sets every setting a fleet config can set.
EVERYTHING = {
    "model": "served",
    "target": {"path": "/m/target", "bits": 4},
    "drafter": {"path": "/m/head", "bits": 6, "depth": {"code": 5, "prose": "auto", "default": 2}, "maxDepth": 6, "kind": "mtp"},
    "maxNumSeqs": 3,
    "maxContextTokens": 4096,
    "prefixCache": {"maxGiB": 0.5, "diskGiB": 64, "dir": "/var/cache/w"},
    "host": "0.0.0.0",
    "port": 8123,
    "distributed": {"hosts": ["a", "b"], "backend": "jaccl", "strategy": "pipeline"},
}


def parse(argv: list[str]):
    return build_parser(argv).parse_args(argv)


def test_every_config_path_of_the_table_is_a_field_of_a_worker_profile():
    leaves = profile_paths()
    assert {s.config for s in WORKER_SETTINGS if s.config} <= set(leaves)


def test_what_a_profile_renders_the_workers_parser_reads_back_as_the_same_values():
    profile = WorkerProfile.model_validate(EVERYTHING)
    argv = worker_argv(profile)
    args = parse(argv[1:])
    rendered = {s.name for s in WORKER_SETTINGS if s.rendered(profile) is not None}
    # Every setting a config can set is on this command line (the depth map too).
    assert rendered == {s.name for s in WORKER_SETTINGS if s.config}
    for s in WORKER_SETTINGS:
        if s.name in rendered:
            assert s.format(getattr(args, s.name)) == s.rendered(profile), s.flag
    assert (args.prefix_cache_dir, args.prefix_cache_disk_gib) == ("/var/cache/w", 64.0)


def test_a_worker_started_without_flags_takes_the_tables_defaults():
    args = parse(["worker", "--model", "/m"])
    assert {s.name: getattr(args, s.name) for s in WORKER_SETTINGS} == {
        s.name: "/m" if s.name == "model" else s.default for s in WORKER_SETTINGS}


def test_worker_config_has_one_field_per_setting_with_the_tables_default():
    fields = {f.name: f for f in dataclasses.fields(WorkerConfig)}
    # `--log-level` configures logging only.
    assert set(fields) == set(SETTINGS) - {"log_level"}
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING and name != "served_model_name":
            assert f.default == SETTINGS[name].default, name


def test_the_table_and_the_config_model_agree_on_every_default_they_share():
    leaves = profile_paths()
    shared = [s for s in WORKER_SETTINGS if s.config and not leaves[s.config].is_required()]
    # `--distributed-backend` is absent on a worker of one process; a config's `distributed` section has its own default.
    for s in shared:
        if s.name != "distributed_backend":
            assert s.default == leaves[s.config].default, s.flag
    assert {s.name for s in shared} >= {"draft_kind", "prefix_cache_gib", "prefix_cache_disk_gib", "prefix_cache_dir",
                                        "host", "distributed_strategy", "max_context_tokens"}


def test_the_choices_are_the_config_models():
    by_path = {s.config: s.choices for s in WORKER_SETTINGS if s.choices and s.config}
    assert by_path == {
        "drafter.kind": typing.get_args(model.DrafterKindSetting),
        "distributed.backend": typing.get_args(model.DistributedBackend),
        "distributed.strategy": typing.get_args(model.ShardStrategy),
    }


def test_the_disk_tier_is_on_the_command_line_only_with_a_directory():
    without = worker_argv(WorkerProfile.model_validate({**EVERYTHING, "prefixCache": {"diskGiB": 64}}))
    assert "--prefix-cache-dir" not in without and "--prefix-cache-disk-gib" not in without
    argv = worker_argv(WorkerProfile.model_validate(EVERYTHING))
    i = argv.index("--prefix-cache-gib")
    assert argv[i : i + 6] == ["--prefix-cache-gib", "0.5", "--prefix-cache-dir", "/var/cache/w", "--prefix-cache-disk-gib", "64"]
    # mlx_lm.server has no disk tier.
    mlx_lm = worker_argv(WorkerProfile.model_validate({**EVERYTHING, "backend": "mlx-lm", "drafter": None, "distributed": None}))
    assert "/var/cache/w" not in mlx_lm


@pytest.mark.parametrize("value", [-1, 1e9, float("nan")])
def test_a_disk_budget_outside_its_range_is_refused_by_the_config(value):
    with pytest.raises(ValueError):
        WorkerProfile.model_validate({**EVERYTHING, "prefixCache": {"diskGiB": value, "dir": "/d"}})


@pytest.mark.parametrize(("flags", "message"), [
    (["--prefix-cache-disk-gib", "-1"], f"`--prefix-cache-disk-gib` must be between 0 and {model.PREFIX_CACHE_GIB_MAX}: -1.0"),
    (["--prefix-cache-disk-gib", "nan"], "`--prefix-cache-disk-gib` must be between 0 and"),
    (["--prefix-cache-gib", "70000"], f"`--prefix-cache-gib` must be between 0 and {model.PREFIX_CACHE_GIB_MAX}: 70000.0"),
    (["--max-num-seqs", "0"], "`--max-num-seqs` must be at least 1: 0"),
])
def test_a_flag_outside_its_range_is_refused_before_loading_with_the_fix(flags, message):
    run = subprocess.run([sys.executable, "-m", "mtpstack", "worker", "--model", "/nonexistent", *flags],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert message in run.stderr and "error:" in run.stderr
    if "disk" in flags[0]:
        assert "hint: pass a size in GiB, or 0 to turn the disk tier off" in run.stderr


def test_the_help_lists_every_flag_of_the_table_with_its_default():
    subparsers = argparse.ArgumentParser(prog="mtpstack").add_subparsers()
    register(subparsers)
    help_text = " ".join(subparsers.choices["worker"].format_help().split())
    for s in WORKER_SETTINGS:
        assert s.flag in help_text
    assert "in GiB; 0 turns the disk tier off (default: 32)" in help_text
