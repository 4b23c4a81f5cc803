"""What a rank learns from the environment `mlx.launch` (or a Nix unit, or `mtpstack up`) gives it,
for the ring and for JACCL, and why a backend this machine lacks is refused: JACCL's group comes
from its RDMA device file (`MLX_IBV_DEVICES`), and its absence is named by its real cause."""

from __future__ import annotations

import json
import platform

import pytest

from mtpstack.errors import UserError
from mtpstack.validator import FleetConfig, rank_peers
from mtpstack.worker.distributed import RankSetting, jaccl_unavailable, join_group, wheel_platform
from mtpstack.worker.launcher import rank_environments

DEVICES = [[None, "rdma_en2", "rdma_en3"], ["rdma_en2", None, "rdma_en4"], ["rdma_en3", "rdma_en4", None]]


def three_macs(backend: str) -> FleetConfig:
    hosts = {f"mac{r}": {"address": f"10.0.0.{11 + r}"} for r in range(3)}
    return FleetConfig.model_validate({
        "proxy": {"deployOn": "mac0"},
        "hosts": hosts,
        "workers": {"big": {
            "model": "m", "target": {"path": "/srv/big", "bits": 4}, "maxNumSeqs": 1, "port": 8101,
            "host": "0.0.0.0", "prefixCache": {"maxGiB": 0},
            "distributed": {"hosts": list(hosts), "backend": backend, **({"ibvDevices": DEVICES} if backend == "jaccl" else {})},
        }},
    })  # fmt: skip


def test_jaccl_ranks_get_the_device_file_and_rank_zeros_address_as_mlx_launch_gives_them(tmp_path):
    config = three_macs("jaccl")
    file = tmp_path / "devices.json"
    envs = rank_environments(rank_peers(config, "big"), "jaccl", file, config.workers["big"].distributed.ibv_devices)
    assert envs == [{"MLX_RANK": str(r), "MLX_IBV_DEVICES": str(file), "MLX_JACCL_COORDINATOR": "10.0.0.11:18101"} for r in range(3)]
    assert json.loads(file.read_text()) == DEVICES


def test_a_jaccl_rank_takes_its_group_size_from_the_device_file(tmp_path):
    config = three_macs("jaccl")
    file = tmp_path / "devices.json"
    env = rank_environments(rank_peers(config, "big"), "jaccl", file, DEVICES)[2]
    setting = RankSetting.from_environ("jaccl", "pipeline", env)
    assert (setting.rank, setting.size, setting.backend) == (2, 3, "jaccl")
    # JACCL's own name for the file wins, as jaccl.cpp reads it first.
    file2 = tmp_path / "two.json"
    file2.write_text(json.dumps(DEVICES[:2]))
    assert RankSetting.from_environ("jaccl", "pipeline", {**env, "MLX_RANK": "1", "JACCL_IBV_DEVICES": str(file2)}).size == 2


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"MLX_RANK": "0"}, "the jaccl backend needs `MLX_IBV_DEVICES` naming its RDMA device file"),
        ({"MLX_RANK": "0", "MLX_IBV_DEVICES": "/nonexistent/devices.json"}, "the jaccl backend needs `MLX_IBV_DEVICES`"),
        ({"MLX_RANK": "3", "MLX_IBV_DEVICES": "FILE"}, "`MLX_RANK` is 3, outside the group of 3 ranks"),
    ],
)  # fmt: skip
def test_a_jaccl_rank_without_a_usable_device_file_is_refused_naming_it(tmp_path, env, says):
    file = tmp_path / "devices.json"
    file.write_text(json.dumps(DEVICES))
    env = {k: str(file) if v == "FILE" else v for k, v in env.items()}
    with pytest.raises(UserError) as e:
        RankSetting.from_environ("jaccl", "tensor", env)
    assert says in e.value.message
    assert "MLX_IBV_DEVICES and MLX_JACCL_COORDINATOR" in e.value.hint


def test_the_ring_still_takes_its_group_from_the_hostfile(tmp_path):
    config = three_macs("ring")
    file = tmp_path / "hostfile.json"
    env = rank_environments(rank_peers(config, "big"), "ring", file)[1]
    assert RankSetting.from_environ("ring", "tensor", env).size == 3


@pytest.mark.skipif(platform.system() == "Darwin", reason="JACCL may be available on a Mac")
def test_jaccl_is_refused_off_macos_by_the_real_mlx_naming_the_platform():
    with pytest.raises(UserError) as e:
        join_group(RankSetting(rank=0, size=2, backend="jaccl", strategy="tensor"))
    assert e.value.message == "mlx's `jaccl` backend is not available on this machine: JACCL (RDMA over Thunderbolt) runs on macOS only"
    assert e.value.hint == "use the `ring` backend on this host"


def test_the_macos_14_metal_wheel_is_named_as_the_cause_and_its_macos_26_wheel_as_the_fix():
    why, hint = jaccl_unavailable("Darwin", "macosx_14_0_arm64")
    assert "its mlx-metal is the `macosx_14_0_arm64` wheel, which MLX builds without JACCL" in why
    assert "install mlx-metal's `macosx_26_0_arm64` wheel" in hint and "macOS 26.2 or later" in hint
    assert jaccl_unavailable("Darwin", "macosx_15_0_arm64")[0] != jaccl_unavailable("Darwin", "macosx_26_0_arm64")[0]


@pytest.mark.parametrize("tag", ["macosx_26_0_arm64", None])
def test_with_jaccl_built_in_the_cause_is_the_macs_rdma(tag):
    why, hint = jaccl_unavailable("Darwin", tag)
    assert why == ": JACCL is built in but found no RDMA support"
    assert "`rdma_ctl enable` in macOS Recovery" in hint


def test_the_metal_wheels_platform_is_read_from_its_wheel_file():
    # The WHEEL file of mlx-metal 0.32.4's macOS 26 wheel, as PyPI serves it.
    text = "Wheel-Version: 1.0\nGenerator: setuptools (84.0.0)\nRoot-Is-Purelib: false\nTag: py3-none-macosx_26_0_arm64\n\n"
    assert wheel_platform(text) == "macosx_26_0_arm64"
    assert wheel_platform("Wheel-Version: 1.0\n") is None
