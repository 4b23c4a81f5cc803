"""Files a careless operator (or a hostile one) could hand to `mtpstack validate`: each gets a
finding with its code and line, JSON under `--format json`, never a traceback or a hang."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpstack.cli import main
from mtpstack.validator import load_config, validate_data
from mtpstack.validator.rules import WILDCARD_HOSTS, canonical_host, check_ports

ROOT = Path(__file__).resolve().parents[2]
VALID = (ROOT / "examples" / "valid" / "fleet.yaml").read_text()


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(['"x"'] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\nproxy: *a9\n"


def validate(path: Path, capsys) -> tuple[int, dict, str]:
    code = main(["validate", str(path), "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.parametrize(
    ("name", "content", "status", "code", "line"),
    [
        ("bomb.yaml", alias_bomb(), 2, "unreadable", 5),
        ("self.yaml", "proxy: &a {x: *a}\n", 2, "unreadable", 1),
        ("lists.yaml", "proxy:\n  port: " + "[" * 1000 + "]" * 1000 + "\n", 2, "unreadable", 2),
        ("lists-999.yaml", "proxy:\n  port: " + "[" * 999 + "]" * 999 + "\n", 2, "unreadable", 2),
        ("deep.json", '{"proxy":\n' + "[" * 2000 + "]" * 2000 + "}", 2, "unreadable", 2),
        ("deep-40.json", '{"proxy":\n' + "[" * 40 + "]" * 40 + "}", 2, "unreadable", 2),
        ("int.yaml", "proxy:\n  port: " + "9" * 5000 + "\n", 2, "unreadable", 2),
        ("int.json", '{"proxy":\n {"port": ' + "9" * 5000 + "}}", 2, "unreadable", 2),
        ("hex.yaml", "proxy:\n  port: 0x" + "f" * 5000 + "\n", 2, "unreadable", 2),
        ("date.yaml", "proxy:\n  host: 2024-13-45\n", 2, "unreadable", None),
        ("key.yaml", "proxy:\n  ? [a, b]\n  : 1\n", 2, "unreadable", 2),
        ("dup.json", '{"proxy": {"port": 8080, "port": 8081}}', 1, "duplicate-key", None),
        ("nan.yaml", "proxy:\n  queue: {timeoutSeconds: .nan}\n", 1, "invalid-value", 2),
        ("inf.yaml", "proxy:\n  timeouts:\n    idleSeconds: .inf\n", 1, "invalid-value", 3),
    ],
)
def test_a_hostile_file_is_a_finding_with_a_code_not_a_traceback(tmp_path, capsys, name, content, status, code, line):
    path = tmp_path / name
    path.write_text(content)
    got, report, err = validate(path, capsys)
    assert got == status, report
    assert code in [f["code"] for f in report["errors"]], report
    finding = next(f for f in report["errors"] if f["code"] == code)
    assert finding["line"] == line, finding
    assert "Traceback" not in err


def test_json_duplicate_keys_name_the_key_path_like_yaml(tmp_path):
    path = tmp_path / "fleet.json"
    path.write_text('{"workers": {}, "proxy": {"queue": {"maxWaiting": 1, "maxWaiting": 2}}}')
    _, report = load_config(path)
    [dup] = [f for f in report.errors if f.code == "duplicate-key"]
    assert dup.path == ("proxy", "queue", "maxWaiting")


def test_a_fifo_is_unreadable_instead_of_blocking_forever(tmp_path, capsys):
    fifo = tmp_path / "fleet.yaml"
    os.mkfifo(fifo)
    got, report, _ = validate(fifo, capsys)
    assert got == 2 and "not a regular file" in report["errors"][0]["message"]


def test_aliases_within_the_bound_are_expanded(tmp_path):
    worker = "  w{i}: {{model: m, target: {{path: t, bits: 4}}, drafter: {d}, maxNumSeqs: 1, port: {port}}}"
    lines = [worker.format(i=0, d="&d {path: d, bits: 6, depth: 3}", port=9000)]
    lines += [worker.format(i=i, d="*d", port=9000 + i) for i in range(1, 300)]
    path = tmp_path / "fleet.yaml"
    path.write_text("proxy: {port: 8080}\nworkers:\n" + "\n".join(lines) + "\n")
    config, report = load_config(path)
    assert report.ok, report.render_text()
    assert [w.drafter.depth for w in config.workers.values()] == [3] * 300


def test_an_internal_error_exits_3_with_a_json_finding(tmp_path, capsys, monkeypatch):
    import mtpstack.validator.cli

    def broken(*args, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(mtpstack.validator.cli, "load_config", broken)
    path = tmp_path / "fleet.yaml"
    path.write_text(VALID)
    assert main(["validate", str(path), "--format", "json"]) == 3
    out, err = capsys.readouterr()
    [finding] = json.loads(out)["errors"]
    assert finding["code"] == "internal-error" and "RuntimeError: boom" in finding["message"]
    assert main(["validate", str(path)]) == 3
    out, err = capsys.readouterr()
    assert "error[internal-error]" in err and "Traceback" not in err


def _ports_quadratic(data: dict) -> list[tuple]:
    """The rule as first written: each listener against every earlier one."""
    listeners = [(("proxy", "port"), data["proxy"]["host"], data["proxy"]["port"])]
    listeners += [(("workers", n, "port"), w["host"], w["port"]) for n, w in data["workers"].items()]
    out = []
    for i, (path, host, port) in enumerate(listeners):
        for other_path, other_host, other_port in listeners[:i]:
            if other_port == port and (host in WILDCARD_HOSTS or other_host in WILDCARD_HOSTS
                                       or canonical_host(host) == canonical_host(other_host)):
                out.append((path, other_path))
                break
    return out


HOSTS = ["127.0.0.1", "localhost", "0.0.0.0", "::", "[::]", "::1", "[::1]", "0:0::1", "10.0.0.1", "Host.example"]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_linear_port_rule_finds_exactly_what_the_pairwise_one_did(data):
    n = data.draw(st.integers(0, 12))
    fleet = {
        "proxy": {"host": data.draw(st.sampled_from(HOSTS)), "port": data.draw(st.integers(1, 4))},
        "workers": {
            f"w{i}": {"model": "m", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1,
                      "host": data.draw(st.sampled_from(HOSTS)), "port": data.draw(st.integers(1, 4))}
            for i in range(n)
        },
    }
    config, _ = validate_data(fleet)
    got = [(f.path, f.related[0]) for f in check_ports(config)]
    assert got == _ports_quadratic(fleet)
