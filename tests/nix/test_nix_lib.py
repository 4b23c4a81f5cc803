"""The pure Nix functions (modules/lib) evaluated by real Nix, without nixpkgs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import typing

import pytest

from mtpstack.validator import config as model
from mtpstack.validator.load import validate_data
from tests.skips import require

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.nix
NIX_FILES = sorted(
    p.relative_to(ROOT)
    for p in [ROOT / "flake.nix", *ROOT.glob("modules/**/*.nix"), *ROOT.glob("examples/nix/**/*.nix"), *ROOT.glob("examples/fleet/*.nix"), *ROOT.glob("tests/nix/*.nix")]
    if p.exists()
)
EXAMPLES = sorted((ROOT / "examples" / "nix").glob("*/*.nix"))


@pytest.mark.parametrize("path", NIX_FILES, ids=str)
def test_every_nix_file_parses(nixh, path):
    nixh.run(["nix-instantiate", "--parse", str(ROOT / path)])


def test_pure_nix_unit_tests_pass(nixh):
    failures = nixh.eval(file=ROOT / "tests" / "nix" / "lib-tests.nix")
    assert failures == []


def render_examples(nixh) -> dict[str, dict]:
    """Every example's rendered config, in one evaluation."""
    entries = " ".join(
        f'{{ name = {nixh.string(str(p.relative_to(ROOT)))}; value = mtp.render (import {p}).services.mtpstack; }}'
        for p in EXAMPLES
    )
    return nixh.eval(f"let mtp = import {nixh.lib}; in builtins.listToAttrs [ {entries} ]")


@pytest.fixture(scope="module")
def rendered_examples(nixh):
    return render_examples(nixh)


def validate(tmp_path: Path, name: str, config: dict) -> tuple[int, dict]:
    file = tmp_path / (Path(name).stem + ".json")
    file.write_text(json.dumps(config))
    proc = subprocess.run(
        [sys.executable, "-m", "mtpstack", "validate", str(file), "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("example", [p for p in EXAMPLES if p.parent.name == "valid"], ids=lambda p: p.name)
def test_valid_example_renders_a_config_that_validates(rendered_examples, tmp_path, example):
    name = str(example.relative_to(ROOT))
    code, report = validate(tmp_path, name, rendered_examples[name])
    assert (code, report["errors"]) == (0, [])


@pytest.mark.parametrize("example", [p for p in EXAMPLES if p.parent.name == "invalid"], ids=lambda p: p.name)
def test_invalid_example_renders_a_config_that_fails_with_its_code(nixh, rendered_examples, tmp_path, example):
    name = str(example.relative_to(ROOT))
    code, report = validate(tmp_path, name, rendered_examples[name])
    assert code == 1
    assert nixh.expected_code(example) in {e["code"] for e in report["errors"]}


def test_render_fills_the_defaults_the_config_model_fills(rendered_examples):
    """The Nix renderer and pydantic agree on every default, key for key."""
    for name, rendered in rendered_examples.items():
        config, _ = validate_data(rendered, name)
        assert config is not None, name
        assert rendered == config.model_dump(by_alias=True, mode="json"), name


def test_the_nix_ranges_and_choices_are_the_config_models(nixh):
    """modules/lib/defaults.nix restates the model's limits (Nix cannot import them): width and depth
    ranges, backends, routings, drafter kinds and bits must be the pydantic model's, value for value."""
    d = nixh.eval(file=nixh.lib / "defaults.nix")
    assert (d["widthMin"], d["widthMax"]) == (model.WIDTH_MIN, model.WIDTH_MAX)
    assert (d["depthMin"], d["depthMax"]) == (model.DEPTH_MIN, model.DEPTH_MAX)
    assert d["drafter"]["maxDepth"] == model.DEPTH_AUTO_MAX_DEFAULT
    assert d["backends"] == list(typing.get_args(model.Backend))
    assert d["routings"] == list(typing.get_args(model.Routing))
    assert d["drafterKinds"] == list(typing.get_args(model.DrafterKindSetting))
    assert d["bits"] == list(typing.get_args(model.Bits))


def test_examples_include_both_kinds():
    kinds = {p.parent.name for p in EXAMPLES}
    assert kinds == {"valid", "invalid"}


NASTY_ARGS = ["a b", "100%", "%n", "$HOME", "${X}", 'q"uote', "back\\slash", "é ü", "tab\there", "new\nline", "semi;colon", "'single'", ""]


def test_exec_start_quoting_is_accepted_by_systemd(nixh, tmp_path):
    if shutil.which("systemd-analyze") is None:
        require("`systemd-analyze` is not on PATH (Debian: apt-get install systemd; `.ci/run` installs it)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mtpstack").write_text("#!/bin/sh\n")
    (bin_dir / "mtpstack").chmod(0o755)
    worker = {"target": {"path": "/srv/my models/t%1", "bits": 4}, "maxNumSeqs": 1, "port": 8101, "extraArgs": NASTY_ARGS}
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"workers": {"w": worker}}))
    units = nixh.eval(
        f"(import {nixh.lib}).systemd.units {{ config = (import {nixh.lib}).render (builtins.fromJSON (builtins.readFile {fleet}));"
        f' configFile = "/etc/mtpstack.json"; binDir = "{bin_dir}"; }}'
    )
    exec_start = units["mtpstack-worker-w"]["serviceConfig"]["ExecStart"]
    unit = tmp_path / "mtpstack-worker-w.service"
    unit.write_text(f"[Unit]\nDescription=test\n\n[Service]\nExecStart={exec_start}\n")
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_the_wildcard_hosts_are_the_runtimes(nixh):
    from mtpstack.runtime import WILDCARD_HOSTS

    assert set(nixh.eval(f"(import {nixh.lib}).firewall.wildcardHosts")) == set(WILDCARD_HOSTS)
