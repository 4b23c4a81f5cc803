"""`bench/scripts/up_ready.py`: the fleet each run starts, and the pairs it refuses before starting any."""

from __future__ import annotations

import pytest

from devkit.scripts import load_script
from mtpstack.validator import validate_data
from mtpstack.worker.demo import DEMO_DIR

_script = load_script("up_ready")


def test_each_run_serves_the_given_pair_through_the_demo_fleet_and_validates(tmp_path):
    models = tmp_path / "pair"
    (models / "target").mkdir(parents=True)
    (models / "mtp").mkdir()
    config = _script.fleet_for(models)
    [worker] = config["workers"].values()
    assert worker["target"]["path"] == str((models / "target").resolve())
    assert worker["drafter"]["path"] == str((models / "mtp").resolve())
    assert config["proxy"]["port"] != worker["port"]
    built, report = validate_data(_script.fleet_for(DEMO_DIR / "models"))
    assert built is not None and not report.errors, report


@pytest.mark.parametrize("pairs", [["a=/nonexistent", "b=/nonexistent"], ["only"], [f"one={DEMO_DIR / 'models'}"]])
def test_a_pair_without_both_folders_or_a_single_pair_is_refused_before_any_run(pairs, capsys):
    with pytest.raises(SystemExit) as e:
        _script.main([arg for p in pairs for arg in ("--pair", p)])
    assert e.value.code == 2
    assert "--pair" in capsys.readouterr().err
