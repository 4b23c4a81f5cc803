"""Which host's parts `mtpstack up` runs, and how `mtpstack status` shows a part placed elsewhere."""

from __future__ import annotations

import pytest

from mtpstack.status import render
from mtpstack.up import UpError, this_host
from mtpstack.validator import validate_data

FLEET = {
    "hosts": {"gw": {"address": "10.0.0.1"}, "mac1": {"address": "10.0.0.11"}},
    "proxy": {"deployOn": "gw"},
    "workers": {"w": {"model": "m", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1, "port": 8101, "host": "0.0.0.0", "deployOn": "mac1"}},
}


def config(data=FLEET):
    built, report = validate_data(data)
    assert built is not None and report.ok, report.render_text()
    return built


@pytest.mark.parametrize(("machine", "host"), [("mac1", "mac1"), ("mac1.local", "mac1"), ("gw", "gw")])
def test_the_host_is_the_declared_one_named_like_this_machine(machine, host):
    assert this_host(config(), None, machine) == host


def test_a_chosen_host_wins_over_the_machines_name():
    assert this_host(config(), "gw", "mac1") == "gw"


def test_a_machine_named_like_no_declared_host_is_told_to_pass_host():
    with pytest.raises(UpError) as e:
        this_host(config(), None, "laptop")
    assert e.value.message == "the fleet is placed on hosts (`gw`, `mac1`) but this machine's name is none of them: `laptop`"
    assert e.value.hint == "pass `--host NAME` to run that host's parts here"


def test_an_unplaced_fleet_runs_whole_whatever_the_machine():
    assert this_host(config({"workers": {}}), None, "laptop") is None


def test_status_shows_a_remote_part_by_its_host_instead_of_a_pid():
    status = {
        "run_dir": "run", "phase": "running", "host": "gw",
        "proxy": {"pid": 42, "host": None, "alive": True, "url": "http://127.0.0.1:8080", "ready": True, "restarts": 0},
        "workers": {"w": {"pid": None, "host": "mac1", "alive": True, "model": "m", "url": "http://10.0.0.11:8101",
                          "health": 200, "inflight": 0, "gate": 1, "restarts": 0,
                          "weights": {"proved": False, "why": "on host `mac1`, as its /identity reports", "target": "t",
                                      "drafter": None, "depth": None}}},
    }  # fmt: skip
    lines = render(status)
    assert lines[0] == "run: run (running, host `gw`)"
    assert lines[2].startswith("worker `w`  on host `mac1`  up    healthy")
    assert lines[3] == "    weights NOT proved (on host `mac1`, as its /identity reports): target `t`, no drafter"
