"""Generated configs through `mtpstack validate --format json`: mutated in structure (odd values,
missing, misspelled and extra keys) and in text (anchors and aliases, tags, nesting, numbers,
encodings, raw bytes). Whatever comes in, the answer is a JSON report and exit 0, 1 or 2:
never a traceback, never exit 3."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devkit.hostile import mutate_structure, mutate_text, random_config, valid_fleet
from mtpstack.cli import main

#: Bounded in count (each example is one in-process validation, a few milliseconds).
EXAMPLES = 300


def _validate(tmp_path, suffix: str, content: bytes, capsys) -> tuple[int, dict]:
    path = tmp_path / f"fleet{suffix}"
    path.write_bytes(content)
    code = main(["validate", str(path), "--format", "json"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.randoms(use_true_random=False))
def test_a_generated_config_gets_a_json_report_and_exit_0_1_or_2(tmp_path_factory, capsys, rng):
    suffix, content = random_config(rng)
    code, report = _validate(tmp_path_factory.mktemp("fuzz"), suffix, content, capsys)
    assert code in (0, 1, 2), (code, report, content[:300])
    assert report["ok"] == (code == 0) or code == 0 and report["warnings"]
    for finding in report["errors"] + report["warnings"]:
        assert finding["code"] != "internal-error"
        assert isinstance(finding["message"], str) and "\n" not in finding["message"]
        assert finding["line"] is None or isinstance(finding["line"], int)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.randoms(use_true_random=False), st.sampled_from([".yaml", ".json"]))
def test_every_text_mutation_of_a_valid_fleet_is_answered(tmp_path_factory, capsys, rng, suffix):
    data = mutate_structure(rng, valid_fleet()) if rng.random() < 0.5 else valid_fleet()
    text = json.dumps(data) if suffix == ".json" else __import__("yaml").safe_dump(data)
    _, content = mutate_text(rng, text, suffix)
    code, report = _validate(tmp_path_factory.mktemp("fuzz"), suffix, content, capsys)
    assert code in (0, 1, 2), (code, report, content[:300])
