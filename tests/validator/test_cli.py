"""The `mtpstack validate` command as operators and CI run it: a real subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "mtpstack", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def expected_code(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path} must start with `# expect: CODE`"
    return first.removeprefix("# expect: ").strip()


@pytest.mark.parametrize("path", sorted((EXAMPLES / "valid").iterdir()), ids=lambda p: p.name)
def test_valid_examples_pass(path):
    result = run("validate", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("path", sorted((EXAMPLES / "invalid").glob("*.yaml")), ids=lambda p: p.name)
def test_invalid_examples_fail_with_their_expected_code(path):
    result = run("validate", str(path), "--format", "json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert expected_code(path) in {f["code"] for f in report["errors"]}


def test_text_findings_carry_file_line_code_and_key_path(tmp_path):
    result = run("validate", str(EXAMPLES / "invalid" / "concurrency-mismatch.yaml"))
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"{EXAMPLES / 'invalid' / 'concurrency-mismatch.yaml'}:12: error[concurrency-mismatch]: ")
    assert "workers.qwen-mtp.maxNumSeqs: " in first
    assert "\n\nhint: raise or lower" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_json_report_shape(tmp_path):
    result = run("validate", str(EXAMPLES / "invalid" / "concurrency-mismatch.yaml"), "--format", "json")
    report = json.loads(result.stdout)
    [finding] = report["errors"]
    assert set(finding) == {"code", "path", "line", "message", "hint", "related"}
    assert finding["path"] == ["workers", "qwen-mtp", "maxNumSeqs"]
    assert finding["related"] == [["proxy", "modelConcurrencyLimits", "qwen3.8-27b"]]
    assert finding["line"] == 12
    assert report["warnings"] == []


def test_json_input_has_no_line_numbers(tmp_path):
    bad = tmp_path / "fleet.json"
    data = json.loads((EXAMPLES / "valid" / "fleet.json").read_text())
    data["workers"]["w"]["maxNumSeqs"] = 3
    bad.write_text(json.dumps(data))
    report = json.loads(run("validate", str(bad), "--format", "json").stdout)
    assert [(f["code"], f["line"]) for f in report["errors"]] == [("concurrency-mismatch", None)]


def test_warnings_pass_unless_strict(tmp_path):
    cfg = tmp_path / "fleet.yaml"
    text = (EXAMPLES / "valid" / "fleet.yaml").read_text().replace("bits: 6, depth: auto", "bits: 4, depth: auto")
    cfg.write_text(text)
    plain = run("validate", str(cfg))
    assert plain.returncode == 0 and "warning[drafter-precision]" in plain.stdout
    assert run("validate", str(cfg), "--strict").returncode == 1


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        (None, None, "no such file"),
        ("proxy:\n  port: [8080\n", 3, "invalid YAML"),
        ("proxy: {port: 1}\n\tworkers: {}\n", 2, "invalid YAML"),
    ],
)
def test_unreadable_input_exits_2_with_a_json_report(tmp_path, content, line, fragment):
    cfg = tmp_path / "fleet.yaml"
    if content is not None:
        cfg.write_text(content)
    result = run("validate", str(cfg), "--format", "json")
    assert result.returncode == 2
    report = json.loads(result.stdout)
    [finding] = report["errors"]
    assert finding["code"] == "unreadable" and finding["line"] == line
    assert fragment in finding["message"]


def test_duplicate_keys_are_not_silently_overwritten(tmp_path):
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text((EXAMPLES / "valid" / "fleet.yaml").read_text() + "proxy: {}\n")
    result = run("validate", str(cfg), "--format", "json")
    assert result.returncode == 1
    dup = [f for f in json.loads(result.stdout)["errors"] if f["code"] == "duplicate-key"]
    assert [(f["path"], f["line"]) for f in dup] == [(["proxy"], 21)]


def test_schema_is_json_schema_with_camel_case_keys():
    result = run("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    worker = schema["$defs"]["WorkerProfile"]
    assert {"maxNumSeqs", "extraArgs", "target", "drafter"} <= set(worker["properties"])
    assert worker["properties"]["maxNumSeqs"]["minimum"] == 1
    assert worker["properties"]["maxNumSeqs"]["maximum"] == 4


def test_schema_offers_the_drafter_kinds_with_auto_as_default():
    kind = json.loads(run("schema").stdout)["$defs"]["DrafterSpec"]["properties"]["kind"]
    assert (kind["enum"], kind["default"]) == (["auto", "mtp", "model"], "auto")
    assert "detected" in kind["description"]
