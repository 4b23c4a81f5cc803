import json

from validator import load_config


def model_dir(root, name, vocab, quant=None, dtype="float32"):
    d = root / name
    d.mkdir()
    cfg = {"vocab_size": vocab, "torch_dtype": dtype}
    if quant:
        cfg["quantization"] = quant
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def fleet(tmp_path, target, drafter, tbits, dbits):
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(
        "workers:\n  w:\n    model: m\n"
        f"    target: {{path: {target}, bits: {tbits}}}\n"
        f"    drafter: {{path: {drafter}, bits: {dbits}, depth: 2}}\n"
        "    maxNumSeqs: 1\n    port: 8101\n"
    )
    return cfg


def deep_codes(cfg):
    _, report = load_config(cfg, deep=True)
    return sorted(f.code for f in report.findings)


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


def test_relative_paths_resolve_against_the_config_folder(tmp_path):
    model_dir(tmp_path, "t", 1024, dtype="bfloat16")
    model_dir(tmp_path, "d", 1024)
    assert deep_codes(fleet(tmp_path, "t", "d", "bf16", "fp32")) == []
    assert deep_codes(fleet(tmp_path, "t", "d", "fp16", "fp32")) == ["bits-mismatch"]


def test_hub_ids_are_skipped(tmp_path):
    assert deep_codes(fleet(tmp_path, "org/not-here", "org/drafter", 4, 6)) == []
