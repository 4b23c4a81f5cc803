"""Placement: `deployOn` and top-level `hosts`, checked for the whole fleet with placement in view."""

from __future__ import annotations

import pytest
import yaml

from mtpstack.validator import validate_data
from mtpstack.validator.load import validate_file
from mtpstack.validator.placement import dial_host, parts_on


def placed(fleet, *, proxy="gw", worker="mac1", host="0.0.0.0"):
    fleet["hosts"] = {"gw": {"address": "10.0.0.1"}, "mac1": {"address": "10.0.0.11"}}
    fleet["proxy"]["deployOn"] = proxy
    fleet["workers"]["qwen-mtp"].update(deployOn=worker, host=host)
    return fleet


def findings(data, code=None):
    _, report = validate_data(data)
    return [f for f in report.findings if code is None or f.code == code]


def test_a_fleet_without_placement_runs_whole_on_every_host(fleet):
    config, report = validate_data(fleet)
    assert report.findings == []
    assert parts_on(config, "anything") == (True, ["qwen-mtp"])
    assert dial_host(config, "qwen-mtp") == "127.0.0.1"


def test_a_placed_fleet_runs_each_part_on_its_host_only_and_dials_remote_workers_at_their_address(fleet):
    config, report = validate_data(placed(fleet))
    assert report.findings == []
    assert parts_on(config, "gw") == (True, [])
    assert parts_on(config, "mac1") == (False, ["qwen-mtp"])
    assert dial_host(config, "qwen-mtp") == "10.0.0.11"


def test_a_worker_on_the_proxys_own_host_is_dialled_at_its_listen_address(fleet):
    config, report = validate_data(placed(fleet, worker="gw", host="127.0.0.1"))
    assert [f.code for f in report.findings] == ["host-runs-nothing"]  # mac1 now runs nothing
    assert dial_host(config, "qwen-mtp") == "127.0.0.1"


@pytest.mark.parametrize(("where", "path"), [("worker", ("workers", "qwen-mtp", "deployOn")), ("proxy", ("proxy", "deployOn"))])
def test_deploy_on_an_undeclared_host_is_an_error_with_did_you_mean(fleet, where, path):
    [f] = findings(placed(fleet, **{where: "mac-1"}), "unknown-host")
    assert (f.severity, f.path) == ("error", path)
    assert f.message == "no host `mac-1` is declared under `hosts` (declared: `gw`, `mac1`)"
    assert f.hint == "did you mean `mac1`?"


def test_placing_a_worker_but_not_the_proxy_is_an_error_naming_the_429_storm(fleet):
    [f] = findings(placed(fleet, proxy=None), "proxy-not-placed")
    assert (f.severity, f.path, f.related) == ("error", ("proxy", "deployOn"), (("workers", "qwen-mtp", "deployOn"),))
    assert "two proxies each fill the same worker's gate" in f.message
    assert f.hint == "set `proxy.deployOn` to the one host that runs the proxy"


def test_placing_only_the_proxy_leaves_the_workers_on_every_host(fleet):
    fleet["hosts"] = {"gw": {"address": "10.0.0.1"}}
    fleet["proxy"]["deployOn"] = "gw"
    config, report = validate_data(fleet)
    assert report.findings == [] and parts_on(config, "gw") == (True, ["qwen-mtp"])


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"])
def test_a_remote_worker_listening_on_loopback_is_unreachable(fleet, host):
    [f] = findings(placed(fleet, host=host), "worker-unreachable")
    assert (f.severity, f.path) == ("error", ("workers", "qwen-mtp", "host"))
    assert "the proxy on host `gw` cannot reach it" in f.message


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.11", "::"])
def test_a_remote_worker_listening_on_the_network_is_reachable(fleet, host):
    assert findings(placed(fleet, host=host), "worker-unreachable") == []


def test_a_declared_host_that_runs_nothing_is_a_warning(fleet):
    placed(fleet)["hosts"]["spare"] = {"address": "10.0.0.99"}
    _, report = validate_data(fleet)
    [f] = report.findings
    assert (f.code, f.severity, f.path) == ("host-runs-nothing", "warning", ("hosts", "spare"))
    assert report.ok


def test_the_same_port_on_two_hosts_is_no_conflict_but_on_one_host_it_is(fleet):
    placed(fleet)["proxy"]["port"] = 8101
    assert findings(fleet, "port-conflict") == []
    fleet["workers"]["qwen-mtp"]["deployOn"] = "gw"
    [f] = findings(fleet, "port-conflict")
    assert "of host `gw`" in f.message


def test_a_conflict_among_parts_on_every_host_is_reported_once(fleet):
    fleet["hosts"] = {"gw": {"address": "10.0.0.1"}, "mac1": {"address": "10.0.0.11"}}
    fleet["proxy"]["deployOn"] = "gw"
    fleet["workers"]["b"] = dict(fleet["workers"]["qwen-mtp"])
    assert len(findings(fleet, "port-conflict")) == 1


def test_a_host_needs_an_address(fleet):
    fleet["hosts"] = {"gw": {}}
    _, report = validate_data(fleet)
    assert [(f.code, f.path) for f in report.findings] == [("missing-key", ("hosts", "gw", "address"))]


def test_placement_findings_carry_the_line_of_the_key(fleet, tmp_path):
    file = tmp_path / "fleet.yaml"
    file.write_text(yaml.safe_dump(placed(fleet, worker="mac2"), sort_keys=False))
    [f] = [f for f in validate_file(file).findings if f.code == "unknown-host"]
    lines = file.read_text().splitlines()
    assert lines[f.line - 1].strip() == "deployOn: mac2"
