"""`validate --deep`'s memory budget: weights plus KV cache per worker against `hosts.<name>.memoryGiB`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from mtpstack.validator import load_config

#: 2 layers x 2 KV heads x 16 dims x 2 (keys and values) x 2 bytes x 1024 tokens = 256 KiB per sequence.
CONFIG = {"num_hidden_layers": 2, "max_position_embeddings": 1024, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "vocab_size": 64, "torch_dtype": "float16"}  # fmt: skip
KV_PER_SEQUENCE = 2 * 2 * 16 * 2 * 2 * 1024


def model(directory, n_floats=1024):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    save_file({"w": np.zeros(n_floats, dtype=np.float32)}, str(directory / "model.safetensors"))
    return directory


def fleet(tmp_path, target: str, memory_gib: float, width: int = 2, max_context: int | None = None,
          prefix_cache_gib: float = 0) -> object:
    """A placed one-worker fleet, validated with `--deep`; the prefix cache is off unless asked for."""
    data = {
        "hosts": {"mac1": {"address": "10.0.0.11", "memoryGiB": memory_gib}, "gw": {"address": "10.0.0.1"}},
        "proxy": {"deployOn": "gw", "concurrencyLimit": width},
        "workers": {"w": {"model": "m", "target": {"path": target, "bits": "fp16"}, "maxNumSeqs": width,
                          "port": 8101, "host": "0.0.0.0", "deployOn": "mac1"}},
    }  # fmt: skip
    if max_context is not None:
        data["workers"]["w"]["maxContextTokens"] = max_context
    data["workers"]["w"]["prefixCache"] = {"maxGiB": prefix_cache_gib}
    file = tmp_path / "fleet.yaml"
    file.write_text(yaml.safe_dump(data))
    return load_config(file, deep=True)[1]


def memory_findings(report):
    return [f for f in report.findings if f.code in {"host-memory-exceeded", "memory-check-skipped"}]


def test_workers_that_fit_pass(tmp_path):
    model(tmp_path / "t")
    assert memory_findings(fleet(tmp_path, "t", memory_gib=1)) == []


def test_workers_that_do_not_fit_are_refused_with_the_numbers(tmp_path):
    model(tmp_path / "t")
    # 2 sequences of KV (512 KiB) plus the weights: more than 0.0004 GiB (~420 KiB).
    report = fleet(tmp_path, "t", memory_gib=0.0004)
    [f] = memory_findings(report)
    assert (f.code, f.severity, f.path) == ("host-memory-exceeded", "error", ("hosts", "mac1", "memoryGiB"))
    assert "need about 0.0 GiB but it has 0.0004 GiB" in f.message
    assert "KV cache 0.0 GiB (2 x 1024 tokens)" in f.message and "target weights" in f.message
    assert not report.ok


def test_the_kv_cache_grows_with_the_batch_width(tmp_path):
    model(tmp_path / "t", n_floats=16)
    budget = (3 * KV_PER_SEQUENCE) / 1024**3  # room for 3 sequences' KV and the tiny weights, not 4
    assert memory_findings(fleet(tmp_path, "t", memory_gib=budget * 1.01, width=2)) == []
    [f] = memory_findings(fleet(tmp_path, "t", memory_gib=budget * 1.01, width=4))
    assert f.code == "host-memory-exceeded"


def test_the_kv_cache_is_counted_at_max_context_tokens_when_set(tmp_path):
    model(tmp_path / "t", n_floats=16)
    budget = (3 * KV_PER_SEQUENCE) / 1024**3  # 4 sequences at the model's 1024 tokens do not fit
    assert memory_findings(fleet(tmp_path, "t", memory_gib=budget * 1.01, width=4))
    # capped at 512 tokens, 4 sequences hold as much KV as 2 at 1024
    assert memory_findings(fleet(tmp_path, "t", memory_gib=budget * 1.01, width=4, max_context=512)) == []
    [f] = memory_findings(fleet(tmp_path, "t", memory_gib=0.0001, width=4, max_context=512))
    assert "(4 x 512 tokens)" in f.message


def test_a_cap_beyond_the_models_maximum_is_counted_at_the_maximum_the_worker_serves(tmp_path):
    model(tmp_path / "t", n_floats=16)
    report = fleet(tmp_path, "t", memory_gib=0.0001, width=4, max_context=4096)
    # `--deep` refuses the cap itself (`context-beyond-model`), and the worker serves the model's 1024 tokens.
    assert "context-beyond-model" in {f.code for f in report.findings}
    [f] = memory_findings(report)
    assert "(4 x 1024 tokens)" in f.message


def test_the_prefix_cache_budget_counts_against_the_host(tmp_path):
    model(tmp_path / "t")
    assert memory_findings(fleet(tmp_path, "t", memory_gib=1, prefix_cache_gib=0.5)) == []
    [f] = memory_findings(fleet(tmp_path, "t", memory_gib=1, prefix_cache_gib=1))
    assert f.code == "host-memory-exceeded" and "prefix cache 1 GiB" in f.message
    assert "prefixCache.maxGiB" in f.hint


def test_a_hub_id_is_read_from_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model(tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123")
    [f] = memory_findings(fleet(tmp_path, "org/tiny", memory_gib=0.0004))
    assert f.code == "host-memory-exceeded"


def test_without_the_files_the_check_says_it_was_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    [f] = memory_findings(fleet(tmp_path, "org/absent", memory_gib=0.0004))
    assert (f.code, f.severity) == ("memory-check-skipped", "warning")
    assert f.message == "the memory of host `mac1` was not checked: worker `w` has no local files for `org/absent`"


@pytest.mark.parametrize("memory", [0, -1])
def test_memory_must_be_positive(tmp_path, memory):
    model(tmp_path / "t")
    assert [f.code for f in fleet(tmp_path, "t", memory_gib=memory).findings] == ["out-of-range"]
