import json

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from mtpstack.validator import load_config

TINY = np.zeros((2, 2), dtype=np.float32)
TARGET_TENSORS = ("model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight")
HEAD_TENSORS = ("fc.weight", "layers.0.self_attn.q_proj.weight", "norm.weight")


def model_dir(root, name, vocab=None, quant=None, dtype="float32", *, config=None, tensors=()):
    """A model directory: `config.json` (the flat one from `vocab`, `quant`, `dtype`, or `config`)
    and, when `tensors` are named, one safetensors file holding a tiny array under each name."""
    d = root / name
    d.mkdir()
    if config is None:
        config = {"vocab_size": vocab, "torch_dtype": dtype}
        if quant:
            config["quantization"] = quant
    (d / "config.json").write_text(json.dumps(config))
    if tensors:
        save_file({t: TINY for t in tensors}, str(d / "model.safetensors"))
    return d


def qwen35(root, name="t", *, hidden=64, vocab=1024, bundled=False):
    """A Qwen3.5-style target: its language model's settings only inside `text_config`."""
    text = {"model_type": "qwen3_5_text", "hidden_size": hidden, "vocab_size": vocab, "torch_dtype": "bfloat16"}
    tensors = TARGET_TENSORS + (("mtp.fc.weight", "mtp.layers.0.mlp.up_proj.weight") if bundled else ())
    return model_dir(root, name, config={"model_type": "qwen3_5", "text_config": text}, tensors=tensors)


def mtp_head(root, name="head", *, family="qwen3_5", hidden=64, vocab=1024):
    text = {"model_type": family, "hidden_size": hidden, "vocab_size": vocab, "torch_dtype": "bfloat16"}
    return model_dir(root, name, config={"model_type": "qwen3_5_mtp", "text_config": text}, tensors=HEAD_TENSORS)


def fleet(tmp_path, target, drafter, tbits, dbits, *, backend="native", kind=None):
    worker = {
        "model": "m",
        "backend": backend,
        "target": {"path": str(target), "bits": tbits},
        "drafter": {"path": str(drafter), "bits": dbits, "depth": 2} | ({"kind": kind} if kind else {}),
        "maxNumSeqs": 1,
        "port": 8101,
    }
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(yaml.safe_dump({"policy": {"allowedBackends": ["native", "mlx-lm"]}, "workers": {"w": worker}}))
    return cfg


def deep_findings(cfg):
    _, report = load_config(cfg, deep=True)
    return report.findings


def deep_codes(cfg):
    """The problems `--deep` finds (its notes, such as the MTP family found, left out)."""
    return sorted(f.code for f in deep_findings(cfg) if f.severity != "note")


def deep_notes(cfg):
    return [f.message for f in deep_findings(cfg) if f.severity == "note"]


def test_matching_local_models_pass(tmp_path):
    t = model_dir(tmp_path, "t", 1024, {"bits": 4, "group_size": 64})
    d = model_dir(tmp_path, "d", 1024, {"bits": 6, "group_size": 64})
    assert deep_codes(fleet(tmp_path, t, d, 4, 6)) == []


def test_vocab_and_bits_mismatches_are_found_only_with_deep(tmp_path):
    t = model_dir(tmp_path, "t", 1024, {"bits": 4, "group_size": 64})
    d = model_dir(tmp_path, "d", 2048)
    cfg = fleet(tmp_path, t, d, 8, "fp32")
    assert deep_codes(cfg) == ["bits-mismatch", "vocab-mismatch"]
    _, shallow = load_config(cfg)
    assert shallow.findings == []


def test_vocab_and_bits_kept_in_text_config_are_checked_too(tmp_path):
    t = qwen35(tmp_path, vocab=1024)
    # every layer attention (`full_attention_interval` 1): a qwen3_5 that may draft
    text = {"vocab_size": 2048, "dtype": "float16", "full_attention_interval": 1}
    d = model_dir(tmp_path, "d", config={"model_type": "qwen3_5", "text_config": text})
    findings = deep_findings(fleet(tmp_path, t, d, 4, "bf16"))
    assert sorted((f.code, f.path[-2:]) for f in findings) == [
        ("bits-mismatch", ("drafter", "bits")),
        ("bits-mismatch", ("target", "bits")),
        ("vocab-mismatch", ("drafter", "path")),
    ]
    assert any("records bf16" in f.message for f in findings)


def test_relative_paths_resolve_against_the_config_folder(tmp_path):
    model_dir(tmp_path, "t", 1024, dtype="bfloat16")
    model_dir(tmp_path, "d", 1024)
    assert deep_codes(fleet(tmp_path, "t", "d", "bf16", "fp32")) == []
    assert deep_codes(fleet(tmp_path, "t", "d", "fp16", "fp32")) == ["bits-mismatch"]


def test_hub_ids_are_skipped(tmp_path):
    assert deep_codes(fleet(tmp_path, "org/not-here", "org/drafter", 4, 6)) == []


@pytest.mark.parametrize("kind", [None, "auto", "mtp"])
def test_a_head_made_for_the_target_passes_declared_or_detected(tmp_path, kind):
    assert deep_codes(fleet(tmp_path, qwen35(tmp_path), mtp_head(tmp_path), "bf16", "bf16", kind=kind)) == []


@pytest.mark.parametrize(
    ("head", "says"),
    [
        ({"hidden": 128}, "the head's hidden size is 128 but the target's is 64"),
        ({"vocab": 4096}, "the head's vocabulary has 4096 tokens but the target's has 1024"),
        ({"family": "qwen3_5_moe"}, "the head was made for `qwen3_5_moe` models but the target is `qwen3_5`"),
    ],
)
def test_a_head_made_for_another_target_is_a_head_mismatch(tmp_path, head, says):
    [f] = deep_findings(fleet(tmp_path, qwen35(tmp_path), mtp_head(tmp_path, **head), "bf16", "bf16"))
    assert (f.code, f.path, f.related) == ("mtp-head-mismatch", ("workers", "w", "drafter", "path"), (("workers", "w", "target", "path"),))
    assert f.message == f"this MTP head cannot draft for the target: {says}"
    assert f.hint == "use the MTP head made for this target"


def test_a_head_for_another_architecture_is_a_head_mismatch(tmp_path):
    llama = model_dir(tmp_path, "t", config={"model_type": "llama", "hidden_size": 64, "vocab_size": 1024}, tensors=TARGET_TENSORS)
    [f] = deep_findings(fleet(tmp_path, llama, mtp_head(tmp_path), 4, "bf16"))
    assert f.code == "mtp-head-mismatch" and "but the target is `llama`" in f.message


def test_a_detected_head_on_mlx_lm_cannot_load(tmp_path):
    cfg = fleet(tmp_path, qwen35(tmp_path), mtp_head(tmp_path), "bf16", "bf16", backend="mlx-lm")
    _, shallow = load_config(cfg)
    assert shallow.findings == []  # kind auto and two paths: only the files tell
    [f] = deep_findings(cfg)
    assert f.code == "mlx-lm-cannot-load-mtp"
    assert f"`{tmp_path / 'head'}` holds an MTP head (read from its files)" in f.message


def test_a_declared_head_on_mlx_lm_is_reported_once(tmp_path):
    cfg = fleet(tmp_path, qwen35(tmp_path), mtp_head(tmp_path), "bf16", "bf16", backend="mlx-lm", kind="mtp")
    assert deep_codes(cfg) == ["mlx-lm-cannot-load-mtp"]


def test_declared_mtp_on_a_plain_model_is_a_head_mismatch(tmp_path):
    plain = model_dir(tmp_path, "d", config={"model_type": "qwen3", "vocab_size": 1024}, tensors=TARGET_TENSORS)
    [f] = deep_findings(fleet(tmp_path, qwen35(tmp_path), plain, "bf16", "fp32", kind="mtp"))
    assert (f.code, f.path) == ("mtp-head-mismatch", ("workers", "w", "drafter", "path"))
    assert f.message == f"`drafter.kind` is `mtp` but `{plain}` is not an MTP head (its `model_type` is `qwen3`); the worker would find no head to load"
    assert f.hint.startswith("point `drafter.path` at the MTP head made for this target")


def test_a_bundled_head_passes_and_its_absence_is_a_head_mismatch(tmp_path):
    with_head = qwen35(tmp_path, "with-head", bundled=True)
    assert deep_codes(fleet(tmp_path, with_head, with_head, "bf16", "bf16")) == []
    without = qwen35(tmp_path, "without")
    [f] = deep_findings(fleet(tmp_path, without, without, "bf16", "bf16"))
    assert f.code == "mtp-head-mismatch"
    assert f"`drafter.path` is the target's own, but `{without}` holds no bundled `mtp.*` tensors" in f.message


def test_declared_model_on_a_head_is_a_kind_mismatch(tmp_path):
    [f] = deep_findings(fleet(tmp_path, qwen35(tmp_path), mtp_head(tmp_path), "bf16", "bf16", kind="model"))
    assert (f.code, f.severity, f.path) == ("drafter-kind-mismatch", "error", ("workers", "w", "drafter", "kind"))
    assert "is an MTP head (`model_type` `qwen3_5_mtp`)" in f.message
    assert f.hint == "set `drafter.kind` to `mtp`, or leave it `auto`"


@pytest.mark.parametrize("kind", [None, "model"])
def test_a_hybrid_as_a_separate_draft_model_is_refused(tmp_path, kind):
    [f] = deep_findings(fleet(tmp_path, qwen35(tmp_path), qwen35(tmp_path, "small"), "bf16", "bf16", kind=kind))
    assert (f.code, f.severity, f.path) == ("recurrent-draft-model", "error", ("workers", "w", "drafter", "path"))
    assert "gated-delta layers" in f.message and "drafter.kind: mtp" in f.hint


def test_a_qwen35_whose_every_layer_is_attention_may_draft(tmp_path):
    text = {"model_type": "qwen3_5_text", "hidden_size": 64, "vocab_size": 1024, "full_attention_interval": 1}
    small = model_dir(tmp_path, "small", config={"model_type": "qwen3_5", "text_config": text}, tensors=TARGET_TENSORS)
    assert deep_findings(fleet(tmp_path, qwen35(tmp_path), small, "bf16", "bf16")) == []


def test_a_declared_kind_is_checked_even_when_the_target_is_a_hub_id(tmp_path):
    cfg = fleet(tmp_path, "org/qwen3.5-target", mtp_head(tmp_path), "bf16", "bf16", kind="model")
    assert deep_codes(cfg) == ["drafter-kind-mismatch"]


def capped_fleet(tmp_path, target, cap):
    worker = {"model": "m", "target": {"path": str(target), "bits": "fp32"}, "maxNumSeqs": 1, "port": 8101, "maxContextTokens": cap}
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(yaml.safe_dump({"workers": {"w": worker}}))
    return cfg


@pytest.mark.parametrize("where", ["top", "text_config"])
def test_max_context_tokens_beyond_the_models_own_maximum_is_refused(tmp_path, where):
    settings = {"vocab_size": 64, "torch_dtype": "float32", "max_position_embeddings": 2048}
    config = settings if where == "top" else {"model_type": "qwen3_5", "text_config": settings}
    t = model_dir(tmp_path, "t", config=config)
    assert deep_codes(capped_fleet(tmp_path, t, 2048)) == []
    [f] = deep_findings(capped_fleet(tmp_path, t, 4096))
    assert (f.code, f.severity, f.path) == ("context-beyond-model", "error", ("workers", "w", "maxContextTokens"))
    assert "4096" in f.message and "at most 2048" in f.message
    assert "at most 2048" in f.hint and "null" in f.hint
    _, shallow = load_config(capped_fleet(tmp_path, t, 4096))
    assert shallow.findings == []


def test_max_context_tokens_is_unchecked_when_the_model_records_no_maximum(tmp_path):
    t = model_dir(tmp_path, "t", 64)
    assert deep_codes(capped_fleet(tmp_path, t, 10**9)) == []


# -- MTP families and layouts ----------------------------------------------------------------


def test_a_served_head_is_reported_as_a_note_naming_its_family_and_layout(tmp_path):
    cfg = fleet(tmp_path, qwen35(tmp_path), mtp_head(tmp_path), "bf16", "bf16")
    [f] = deep_findings(cfg)
    assert (f.code, f.severity, f.path) == ("mtp-family", "note", ("workers", "w", "drafter", "path"))
    assert f.message == "a `qwen3_5_mtp` head: a standalone head folder, a dense MLP, unquantized"
    _, report = load_config(cfg, deep=True)
    assert report.ok and report.to_json()["notes"][0]["code"] == "mtp-family"


def test_a_bundled_head_is_reported_with_its_prefix(tmp_path):
    with_head = qwen35(tmp_path, "with-head", bundled=True)
    assert deep_notes(fleet(tmp_path, with_head, with_head, "bf16", "bf16")) == [
        "a `qwen3_5_mtp` head: bundled in the target's checkpoint as `mtp.*`, a dense MLP, unquantized"]


@pytest.mark.parametrize(("tensors", "says"), [
    (("layers.0.mlp.switch_mlp.gate_proj.weight", "layers.0.mlp.switch_mlp.gate_proj.scales"), "stacked MoE experts"),
    (("layers.0.mlp.experts.0.gate_proj.weight", "layers.0.mlp.experts.1.gate_proj.weight"), "per-expert MoE tensors"),
    (("layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.experts.down_proj"), "fused `gate_up_proj` MoE experts"),
])
def test_a_moe_heads_layout_and_per_path_quantization_are_named(tmp_path, tensors, says):
    text = {"model_type": "qwen3_5_moe_text", "hidden_size": 64, "vocab_size": 1024, "num_experts": 4}
    quant = {"bits": 6, "group_size": 64, "layers.0.mlp.gate": {"bits": 8, "group_size": 64},
             "layers.0.mlp.shared_expert_gate": {"bits": 8, "group_size": 64}}
    head = model_dir(tmp_path, "head", config={"model_type": "qwen3_5_mtp", "text_config": text, "quantization": quant},
                     tensors=HEAD_TENSORS + tensors + ("layers.0.mlp.gate.scales",))
    target = model_dir(tmp_path, "t", config={"model_type": "qwen3_5_moe", "text_config": text}, tensors=TARGET_TENSORS)
    [note] = deep_notes(fleet(tmp_path, target, head, "bf16", 6))
    assert note == f"a `qwen3_5_mtp` head: a standalone head folder, {says}, 6-bit with 2 per-module overrides"


def test_a_head_of_a_family_not_served_is_refused_saying_why(tmp_path, monkeypatch):
    import dataclasses

    from mtpstack.validator import BY_HEAD_TYPE

    # Every family in the table is served today; one marked otherwise stands for the next one added.
    monkeypatch.setitem(BY_HEAD_TYPE, "glm4_moe_lite_mtp", dataclasses.replace(
        BY_HEAD_TYPE["glm4_moe_lite_mtp"], served=False, why_not="its state cannot be rolled back"))
    text = {"model_type": "glm4_moe_lite", "hidden_size": 64, "vocab_size": 1024}
    head = model_dir(tmp_path, "head", config={"model_type": "glm4_moe_lite_mtp", "text_config": text}, tensors=HEAD_TENSORS)
    target = model_dir(tmp_path, "t", config=dict(text), tensors=TARGET_TENSORS)
    [f] = deep_findings(fleet(tmp_path, target, head, "bf16", "bf16"))
    assert (f.code, f.severity) == ("mtp-family-not-served", "error")
    assert "`glm4_moe_lite_mtp` head, which the worker does not serve: its state cannot be rolled back" in f.message


@pytest.mark.parametrize(("model_type", "layers", "head_tensors", "note"), [
    ("glm4_moe_lite", 3, ("model.layers.3.eh_proj.weight", "model.layers.3.mlp.experts.0.gate_proj.weight"),
     "a `glm4_moe_lite_mtp` head: bundled in the target's checkpoint as `model.layers.3.*`, per-expert MoE tensors, unquantized"),
    ("nemotron_h", 4, ("mtp.layers.0.eh_proj.weight", "mtp.layers.1.mixer.experts.0.up_proj.weight"),
     "a `nemotron_h_mtp` head: bundled in the target's checkpoint as `mtp.*`, per-expert MoE tensors, unquantized"),
], ids=["glm-as-a-layer-past-the-last", "nemotron-as-mtp-tensors"])
def test_a_head_bundled_in_the_targets_checkpoint_is_found_and_named_with_its_family(tmp_path, model_type, layers, head_tensors, note):
    config = {"model_type": model_type, "hidden_size": 64, "vocab_size": 1024, "num_hidden_layers": layers}
    target = model_dir(tmp_path, "t", config=config, tensors=TARGET_TENSORS + head_tensors)
    assert deep_notes(fleet(tmp_path, target, target, "bf16", "bf16")) == [note]


def test_mtp_tensors_in_a_target_of_no_known_family_are_refused(tmp_path):
    llama = model_dir(tmp_path, "t", config={"model_type": "llama", "vocab_size": 1024}, tensors=TARGET_TENSORS + ("mtp.fc.weight",))
    [f] = deep_findings(fleet(tmp_path, llama, llama, "bf16", "bf16"))
    assert f.code == "mtp-family-not-served" and "no MTP family is known for `llama` targets" in f.message
    assert "`qwen3_5_moe`" in f.hint


def test_a_mamba2_hybrid_as_a_separate_draft_model_is_refused_naming_its_layers(tmp_path):
    nemotron = model_dir(tmp_path, "small", config={"model_type": "nemotron_h", "vocab_size": 1024}, tensors=TARGET_TENSORS)
    [f] = deep_findings(fleet(tmp_path, qwen35(tmp_path), nemotron, "bf16", "bf16"))
    assert f.code == "recurrent-draft-model" and "a `nemotron_h` model with mamba2 layers" in f.message


def test_a_disk_budget_beyond_the_free_space_is_a_warning(tmp_path):
    import shutil as sh

    target, head = qwen35(tmp_path), mtp_head(tmp_path)
    cfg = fleet(tmp_path, target, head, "fp32", "fp32")
    data = yaml.safe_load(cfg.read_text())
    free_gib = sh.disk_usage(tmp_path).free / 2**30
    data["workers"]["w"]["prefixCache"] = {"dir": str(tmp_path / "cache" / "w"), "diskGiB": round(free_gib * 2 + 1)}
    cfg.write_text(yaml.safe_dump(data))
    [f] = [f for f in deep_findings(cfg) if f.code == "prefix-cache-disk-space"]
    assert f.severity == "warning" and f.path == ("workers", "w", "prefixCache", "diskGiB") and "free" in f.message
    data["workers"]["w"]["prefixCache"]["diskGiB"] = 0.001
    cfg.write_text(yaml.safe_dump(data))
    assert "prefix-cache-disk-space" not in [f.code for f in deep_findings(cfg)]
    _, report = load_config(cfg, deep=False)
    assert "prefix-cache-disk-space" not in [f.code for f in report.findings]
