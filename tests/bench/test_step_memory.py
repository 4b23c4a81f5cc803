"""The memory bench's prediction (`step_profile.py --memory`): bytes a row keeps per drafted position, from a
model's dimensions; and one real step a configuration."""

from __future__ import annotations

from devkit.scripts import load_script
from tests.bench.conftest import run_bench

sm = load_script("step_profile")  # its --memory mode


def test_the_prediction_at_qwen35_35b_a3b_dimensions_is_the_documented_60_mib_of_state():
    b = sm.predicted_bytes(sm.MODEL_DIMS["qwen3.5-35b-a3b"])
    assert b["state"] == 30 * 32 * 128 * 128 * 4 == 60 * 2**20
    assert b["conv"] == 30 * (2 * 16 * 128 + 32 * 128) * 2
    assert b["kv"] == 10 * 2 * 2 * 256 * 2
    assert b["total"] == b["state"] + b["conv"] + b["kv"]


def test_replayed_the_state_is_kept_once_a_row_and_only_the_small_inputs_a_position():
    one, four = (sm.predicted_bytes(sm.MODEL_DIMS["qwen3.5-35b-a3b"], depth, replayed=True) for depth in (1, 4))
    assert one["state"] == 60 * 2**20 == 4 * four["state"]  # one replayed state a row, whatever the depth
    assert one["inputs"] == four["inputs"] == 30 * (2 * 16 * 128 + 32 * 128 + 2 * 32) * 2  # q, k, v and the gates
    assert four["total"] == four["state"] + four["conv"] + four["inputs"] + four["kv"]
    assert four["total"] < sm.predicted_bytes(sm.MODEL_DIMS["qwen3.5-35b-a3b"], 4)["total"] / 3


def test_a_target_of_attention_only_keeps_no_recurrent_state():
    dims = dict(sm.WIDE, full_attention_interval=1)
    assert sm.predicted_bytes(dims)["state"] == 0


def test_one_step_a_configuration_is_measured_above_the_plain_step_beside_its_prediction(tmp_path):
    report, _ = run_bench("step_profile", tmp_path / "memory.json", "--memory", "--depths", "1", "--widths", "1",
                          "--repeats", "1")
    (row,) = report["rows"]
    assert row["predicted"] == sm.predicted_bytes(sm.WIDE, 1)["total"] and row["median"] > 0
    assert row["ratio"] == row["median"] / row["predicted"]
