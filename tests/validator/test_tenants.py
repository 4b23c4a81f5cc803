"""The keys file's format (`mtpstack.validator.read_keys_file`) and the tenants' rules: names, a
`maxConcurrent` the fleet can run, a tenant no key line names, hostile files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mtpstack.validator import DEFAULT_TENANT, KeysFileError, read_keys_file, validate_data

ROOT = Path(__file__).resolve().parents[2]


def keys_file(tmp_path, data: bytes | str) -> Path:
    p = tmp_path / "keys"
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


def refusal(tmp_path, data) -> str:
    with pytest.raises(KeysFileError) as e:
        read_keys_file(keys_file(tmp_path, data))
    return e.value.message


def test_name_key_lines_and_key_alone_lines(tmp_path):
    lines = read_keys_file(keys_file(tmp_path, "# team\nalice  sk-a\n\n  bob\tsk-b  \nsk-old-1\nsk-old-2\r\ndefault sk-d\n"))
    assert [(k.tenant, k.key, k.line, k.named) for k in lines] == [
        ("alice", b"sk-a", 2, True), ("bob", b"sk-b", 4, True), (DEFAULT_TENANT, b"sk-old-1", 5, False),
        (DEFAULT_TENANT, b"sk-old-2", 6, False), (DEFAULT_TENANT, b"sk-d", 7, True),
    ]


@pytest.mark.parametrize(("text", "message"), [
    ("alice sk-1\nbob sk-2\nalice sk-3\n", "line 3 names tenant `alice` again, already named on line 1"),
    ("alice sk-1\nsk-2\nbob sk-1\n", "line 3 repeats the key of line 1"),
    ("alice sk 1\n", "line 1 has 3 fields; a line is `NAME KEY` or a key alone, and a key holds no spaces"),
    ("al:ce sk-1\n", "line 1: a tenant name may hold only letters"),
    ("alice sk-é\n", "line 1 holds a key with characters other than visible ASCII"),
    ("# nothing\n\n", "holds no keys"),
])
def test_malformed_files_are_refused_naming_the_lines_never_a_key(tmp_path, text, message):
    said = refusal(tmp_path, text)
    assert message in said and "sk-" not in said


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    assert "not UTF-8 text" in refusal(tmp_path, b"alice sk-1\nbob \xff\xfe\n") and "line 2" in refusal(tmp_path, b"a sk-1\nb \xff\n")


def test_a_10_mb_line_and_a_file_beyond_the_bound_are_refused(tmp_path):
    assert "holds a key of 10485760 bytes" in refusal(tmp_path, b"alice " + b"k" * (10 * 1024 * 1024) + b"\n")
    assert "is larger than 32 MiB" in refusal(tmp_path, b"#" * (33 * 1024 * 1024))


def test_100k_tenants_are_read(tmp_path):
    lines = read_keys_file(keys_file(tmp_path, "".join(f"t{i} sk-{i:08d}\n" for i in range(100_000))))
    assert len(lines) == 100_000 and lines[-1].tenant == "t99999"


def tenants(fleet, **tenants):
    fleet["proxy"]["tenants"] = tenants
    return fleet


def test_max_concurrent_within_the_fleets_width_is_valid_and_beyond_it_is_refused(fleet):
    width = sum(fleet["proxy"]["modelConcurrencyLimits"].get(w["model"], fleet["proxy"].get("concurrencyLimit", 1))
                for w in fleet["workers"].values())
    config, report = validate_data(tenants(fleet, alice={"maxConcurrent": width, "weight": 3}))
    assert report.findings == [] and config.proxy.tenants["alice"].weight == 3
    _, report = validate_data(tenants(fleet, alice={"maxConcurrent": width + 1}))
    [f] = report.errors
    assert f.code == "tenant-beyond-fleet" and f.path == ("proxy", "tenants", "alice", "maxConcurrent")
    assert f"admit {width} at once" in f.message and f"at most {width}" in f.hint


def test_a_tenant_name_the_keys_file_cannot_spell_is_refused(fleet):
    _, report = validate_data(tenants(fleet, **{"a b": {}}))
    assert [f.code for f in report.errors] == ["tenant-name"]


@pytest.mark.parametrize("setting", [{"weight": 0}, {"requestsPerMinute": 0}, {"tokensPerMinute": -1}, {"maxConcurrent": "2"}, {"burst": 1}])
def test_limits_are_positive_integers(fleet, setting):
    _, report = validate_data(tenants(fleet, alice=setting))
    assert report.errors and report.errors[0].path[:3] == ("proxy", "tenants", "alice")


def test_a_tenant_no_key_line_names_is_a_warning_an_error_under_strict(fleet, tmp_path):
    keys = keys_file(tmp_path, "alice sk-1\n")
    fleet["proxy"]["apiKeysFile"] = str(keys)
    cfg = tmp_path / "fleet.json"
    cfg.write_text(json.dumps(tenants(fleet, alice={}, bob={"weight": 2})))
    _, report = validate_data(json.loads(cfg.read_text()))
    [w] = report.warnings
    assert report.ok and w.code == "tenant-without-key" and w.path == ("proxy", "tenants", "bob")
    run = [sys.executable, "-m", "mtpstack", "validate", str(cfg)]
    assert subprocess.run(run, capture_output=True, cwd=ROOT).returncode == 0
    strict = subprocess.run([*run, "--strict"], capture_output=True, text=True, cwd=ROOT)
    assert strict.returncode == 1 and "warning[tenant-without-key]" in strict.stdout + strict.stderr


def test_a_malformed_keys_file_is_an_error_and_a_missing_one_is_not_checked_here(fleet, tmp_path):
    fleet["proxy"]["apiKeysFile"] = str(keys_file(tmp_path, "alice sk-1\nbob sk-1\n"))
    _, report = validate_data(fleet)
    [f] = report.errors
    assert f.code == "api-keys-file" and "line 2 repeats the key of line 1" in f.message and "sk-1" not in f.message
    fleet["proxy"]["apiKeysFile"] = str(tmp_path / "on-the-proxy-host-only")  # a secret of another machine
    assert validate_data(fleet)[1].findings == []
