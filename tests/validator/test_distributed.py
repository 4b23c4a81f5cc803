"""A worker that spans hosts (`workers.<name>.distributed`): its placement, its rank ports, its
errors, its command line and each rank's share of a host's memory."""

from __future__ import annotations

import json

import pytest

from mtpstack.validator import CODES, validate_data, worker_argv
from mtpstack.validator.config import RANK_PORT_OFFSET
from mtpstack.validator.memory import GIB, check_memory
from mtpstack.validator.placement import dial_host, parts_on, rank_on, rank_peers


def spanning(fleet, hosts=("mac1", "mac2"), **distributed):
    """The fixture's worker across `hosts` (all declared, IP addresses), the proxy on `gw`."""
    fleet["hosts"] = {"gw": {"address": "10.0.0.1"}, "mac1": {"address": "10.0.0.11"}, "mac2": {"address": "10.0.0.12"}}
    fleet["proxy"]["deployOn"] = "gw"
    fleet["workers"]["qwen-mtp"].update(host="0.0.0.0", prefixCache={"maxGiB": 0}, distributed={"hosts": list(hosts), **distributed})
    return fleet


def findings(data, code=None):
    _, report = validate_data(data)
    return [f for f in report.findings if code is None or f.code == code]


def test_each_listed_host_runs_a_rank_and_the_proxy_dials_rank_0s_host(fleet):
    config, report = validate_data(spanning(fleet))
    assert report.findings == []
    w = config.workers["qwen-mtp"]
    assert parts_on(config, "mac1") == (False, ["qwen-mtp"]) and parts_on(config, "mac2") == (False, ["qwen-mtp"])
    assert parts_on(config, "gw") == (True, [])
    assert (rank_on(w, "mac1"), rank_on(w, "mac2"), rank_on(w, "gw")) == (0, 1, None)
    assert dial_host(config, "qwen-mtp") == "10.0.0.11"
    assert rank_peers(config, "qwen-mtp") == [f"10.0.0.11:{8101 + RANK_PORT_OFFSET}", f"10.0.0.12:{8102 + RANK_PORT_OFFSET}"]


def test_the_defaults_are_ring_and_tensor_and_base_port_follows_the_worker_port(fleet):
    config, _ = validate_data(spanning(fleet))
    d = config.workers["qwen-mtp"].distributed
    assert (d.backend, d.strategy, d.base_port) == ("ring", "tensor", None)
    assert config.workers["qwen-mtp"].base_port == 8101 + RANK_PORT_OFFSET


def test_a_derived_base_port_stays_in_range_near_the_top(fleet):
    fleet = spanning(fleet)
    fleet["workers"]["qwen-mtp"]["port"] = 60000
    config, report = validate_data(fleet)
    assert report.findings == []
    assert config.workers["qwen-mtp"].base_port == 60000 - RANK_PORT_OFFSET


def test_an_explicit_base_port_whose_last_rank_passes_65535_is_out_of_range(fleet):
    [f] = findings(spanning(fleet, basePort=65535), "out-of-range")
    assert f.path == ("workers", "qwen-mtp", "distributed", "basePort")
    assert "rank 1 would listen on port 65536" in f.message
    assert f.hint == "lower `workers.qwen-mtp.distributed.basePort` to at most 65534"


def test_the_argv_names_backend_and_strategy_and_is_the_same_for_every_rank(fleet):
    config, _ = validate_data(spanning(fleet, backend="jaccl", strategy="pipeline"))
    argv = worker_argv(config.workers["qwen-mtp"])
    assert argv[-4:] == ["--distributed-backend", "jaccl", "--distributed-strategy", "pipeline"]


def test_a_rank_port_taken_by_another_listener_on_that_host_is_a_port_conflict(fleet):
    fleet = spanning(fleet)
    fleet["workers"]["other"] = {
        "model": "qwen3.8-27b", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 2,
        "port": 8102 + RANK_PORT_OFFSET, "host": "0.0.0.0", "deployOn": "mac2",
    }
    [f] = findings(fleet, "port-conflict")
    assert f.path == ("workers", "other", "port")
    assert f.related == (("workers", "qwen-mtp", "distributed", "basePort"),)
    assert "of host `mac2`" in f.message


def test_the_http_port_counts_on_rank_0s_host_only(fleet):
    fleet = spanning(fleet)
    # The same port as the distributed worker's HTTP side, on rank 1's host: no conflict.
    fleet["workers"]["other"] = {
        "model": "qwen3.8-27b", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 2, "port": 8101, "host": "0.0.0.0", "deployOn": "mac2",
    }
    assert findings(fleet, "port-conflict") == []


def test_deploy_on_other_than_the_first_host_is_an_error(fleet):
    fleet = spanning(fleet)
    fleet["workers"]["qwen-mtp"]["deployOn"] = "mac2"
    [f] = findings(fleet, "distributed-deploy-on")
    assert f.path == ("workers", "qwen-mtp", "deployOn")
    assert "runs on the first, `mac1`, not on `mac2`" in f.message


def test_deploy_on_the_first_host_is_accepted(fleet):
    fleet = spanning(fleet)
    fleet["workers"]["qwen-mtp"]["deployOn"] = "mac1"
    assert findings(fleet) == []


def test_an_undeclared_rank_host_is_unknown_with_did_you_mean(fleet):
    [f] = findings(spanning(fleet, hosts=("mac1", "mac-2")), "unknown-host")
    assert f.path == ("workers", "qwen-mtp", "distributed", "hosts", "1")
    assert f.hint == "did you mean `mac2`?"


def test_a_host_listed_twice_is_an_error(fleet):
    [f] = findings(spanning(fleet, hosts=("mac1", "mac2", "mac1")), "distributed-duplicate-host")
    assert f.path == ("workers", "qwen-mtp", "distributed", "hosts", "2")


def test_one_host_is_not_distributed(fleet):
    codes = [f.code for f in findings(spanning(fleet, hosts=("mac1",)))]
    assert codes and set(codes) <= {"invalid-value", "out-of-range", "invalid-type"}


def test_the_mlx_lm_backend_cannot_span_hosts(fleet):
    fleet = spanning(fleet)
    fleet["policy"] = {"allowedBackends": ["native", "mlx-lm"]}
    fleet["workers"]["qwen-mtp"].update(backend="mlx-lm", drafter=None)
    fleet["proxy"]["modelConcurrencyLimits"] = {"qwen3.8-27b": 2}
    [f] = findings(fleet, "distributed-needs-native")
    assert f.path == ("workers", "qwen-mtp", "distributed")


def test_the_ring_backend_needs_ip_addresses_and_jaccl_is_not_held_to_it(fleet):
    fleet = spanning(fleet)
    fleet["hosts"]["mac2"]["address"] = "mac2.lan"
    [f] = findings(fleet, "distributed-needs-ip")
    assert f.path == ("hosts", "mac2", "address")
    fleet["workers"]["qwen-mtp"]["distributed"]["backend"] = "jaccl"
    assert findings(fleet, "distributed-needs-ip") == []


@pytest.mark.parametrize("address", ["fd00::12", "[10.0.0.12]", "010.0.0.12", "10.0.0.256"])
def test_the_ring_needs_ipv4_addresses_as_mlx_splits_at_the_first_colon(fleet, address):
    # mlx/distributed/utils.cpp: `ip:port` split at the first colon, AF_INET sockets.
    fleet = spanning(fleet)
    fleet["hosts"]["mac2"]["address"] = address
    [f] = findings(fleet, "distributed-needs-ip")
    assert f.path == ("hosts", "mac2", "address")
    assert "by IPv4 address" in f.message and f"has the address `{address}`" in f.message
    assert f.hint.startswith("give the host its IPv4 address")


def test_jaccl_needs_rank_zeros_address_to_be_ipv4_and_no_other(fleet):
    # JACCL's ranks meet at rank 0's `ip:port` (MLX_JACCL_COORDINATOR), dialled over AF_INET (jaccl/tcp.cpp).
    fleet = spanning(fleet, backend="jaccl", ibvDevices=[[None, "rdma_en2"], ["rdma_en2", None]])
    assert findings(fleet) == []
    fleet["hosts"]["mac1"]["address"] = "fd00::11"
    [f] = findings(fleet, "distributed-needs-ip")
    assert f.path == ("hosts", "mac1", "address")
    assert "meet at rank 0's IPv4 address" in f.message and "rank 0 of worker `qwen-mtp`" in f.message


def test_jaccl_without_its_rdma_devices_is_an_error_with_an_example_to_copy(fleet):
    [f] = findings(spanning(fleet, backend="jaccl"), "distributed-ibv-devices")
    assert (f.severity, f.path) == ("error", ("workers", "qwen-mtp", "distributed", "ibvDevices"))
    assert "reads the RDMA devices that connect the 2 ranks from a file (`MLX_IBV_DEVICES`)" in f.message
    assert f.hint.endswith('e.g. [[null, "rdma_en2"], ["rdma_en2", null]]')


@pytest.mark.parametrize(
    ("devices", "path"),
    [
        ([[None, "rdma_en2"]], ("workers", "qwen-mtp", "distributed", "ibvDevices")),
        ([[None, "rdma_en2"], ["rdma_en2", "rdma_en3"]], ("workers", "qwen-mtp", "distributed", "ibvDevices", "1")),
        ([[None], ["rdma_en2", None]], ("workers", "qwen-mtp", "distributed", "ibvDevices", "0")),
    ],
)  # fmt: skip
def test_jaccl_devices_need_one_row_per_rank_with_null_at_its_own_place(fleet, devices, path):
    # What mlx.launch requires of its hostfile's `rdma` lists (mlx/_distributed_utils/launch.py).
    [f] = findings(spanning(fleet, backend="jaccl", ibvDevices=devices), "distributed-ibv-devices")
    assert (f.severity, f.path) == ("error", path)


def test_jaccl_devices_may_name_several_devices_toward_a_rank(fleet):
    assert findings(spanning(fleet, backend="jaccl", ibvDevices=[[None, ["rdma_en2", "rdma_en3"]], ["rdma_en2", None]])) == []


def test_rdma_devices_on_a_ring_worker_are_a_warning_that_they_go_unused(fleet):
    [f] = findings(spanning(fleet, ibvDevices=[[None, "rdma_en2"], ["rdma_en2", None]]))
    assert (f.code, f.severity) == ("distributed-ibv-devices", "warning")
    assert "set `workers.qwen-mtp.distributed.backend` to `jaccl`" in f.hint


def test_a_distributed_worker_places_the_fleet_so_the_proxy_must_be_placed(fleet):
    fleet = spanning(fleet)
    del fleet["proxy"]["deployOn"]
    [f] = findings(fleet, "proxy-not-placed")
    assert f.related == (("workers", "qwen-mtp", "distributed"),)


def test_a_prefix_cache_budget_on_a_distributed_worker_is_a_warning_naming_the_fix(fleet):
    fleet = spanning(fleet)
    del fleet["workers"]["qwen-mtp"]["prefixCache"]
    [f] = findings(fleet)
    assert (f.code, f.severity, f.path) == ("distributed-no-prefix-cache", "warning", ("workers", "qwen-mtp", "prefixCache", "maxGiB"))
    assert "the 2 GiB here go unused" in f.message
    assert f.hint == "set `workers.qwen-mtp.prefixCache.maxGiB` to 0 for this worker"


def test_every_new_code_is_listed():
    assert {"distributed-deploy-on", "distributed-duplicate-host", "distributed-needs-native", "distributed-needs-ip",
            "distributed-no-prefix-cache", "distributed-ibv-devices"} <= CODES


def _model_dir(path, layers=4, weights_bytes=8 * GIB // 1024):
    path.mkdir()
    path.joinpath("config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "num_hidden_layers": layers, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 1024, "vocab_size": 1024,
    }))
    with open(path / "model.safetensors", "wb") as f:
        f.truncate(weights_bytes)
    return path


@pytest.mark.parametrize(("strategy", "layers", "shares"), [("tensor", 4, (0.5, 0.5)), ("pipeline", 5, (0.6, 0.4))])
def test_each_host_budget_counts_its_ranks_shard_of_the_target(fleet, tmp_path, strategy, layers, shares):
    target = _model_dir(tmp_path / "target", layers=layers)
    fleet = spanning(fleet, strategy=strategy)
    fleet["workers"]["qwen-mtp"].update(target={"path": str(target), "bits": 4}, drafter=None)
    weights = (target / "model.safetensors").stat().st_size
    kv = 2 * layers * 2 * 16 * 2 * 1024 * 2  # K and V, layers, kv heads, head dim, 2 bytes, context, width
    need = [int(weights * s) + int(kv * s) for s in shares]
    # Each host's budget sits between its rank's need and the whole worker's: only the shard counts.
    fleet["hosts"]["mac1"]["memoryGiB"] = (need[0] + 1024) / GIB
    fleet["hosts"]["mac2"]["memoryGiB"] = (need[1] + 1024) / GIB
    config, report = validate_data(fleet)
    assert report.findings == []
    assert list(check_memory(config, tmp_path)) == []
    fleet["hosts"]["mac2"]["memoryGiB"] = (need[1] - 1024) / GIB
    config, _ = validate_data(fleet)
    [f] = check_memory(config, tmp_path)
    assert (f.code, f.path) == ("host-memory-exceeded", ("hosts", "mac2", "memoryGiB"))
    assert "rank 1's shard" in f.message
