"""The agent bench, run for real: `--quick` scenarios on the two servers and on a worker of its own, and
`claude_code` against `mtpstack up`'s demo with a stand-in for Claude Code that sends one turn per call."""

from __future__ import annotations

import os
import shutil
import sys

from tests.bench.conftest import run_bench
from tests.skips import require

#: Answers `--version`, else sends its `-p` prompt as one streaming `/v1/messages` turn, a billing line first.
FAKE_CLAUDE = '''import json, os, sys, urllib.request
if "--version" in sys.argv:
    sys.exit(print("0.0.0 (stand-in)"))
body = {"model": os.environ["ANTHROPIC_MODEL"], "max_tokens": 8, "stream": True,
        "system": [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=0; cch={os.getpid()};"},
                   {"type": "text", "text": "You are a coding agent. " * 40}],
        "messages": [{"role": "user", "content": sys.argv[sys.argv.index("-p") + 1]}]}
req = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
urllib.request.urlopen(req, timeout=600).read()
'''


def run(tmp_path, *args: str) -> tuple[dict, str]:
    report, done = run_bench("agent_bench", tmp_path / "agent.json", *args)
    return report, done.stderr


def test_a_quick_run_times_the_turns_on_both_servers_and_a_restart_on_its_own_worker(tmp_path):
    report, table = run(tmp_path, "--quick", "--only", "turns", "restart")
    for server in ("native+mtp", "mlx_lm.server"):
        s = report["summary"][server]
        assert s["turn1_ttft_s"]["n"] == 1 and s["later_ttft_s"]["n"] == 5 and set(s["thinking"]) == {"off", "on"}
    restart = report["summary"]["restart"]
    assert restart["cached_tokens"]["median"] > 0 and restart["restart_ttft_s"]["n"] == 1
    assert "turns 2+ TTFT: native+mtp / mlx_lm.server = " in table and "restart (" in table


def test_claude_code_gets_a_row_per_turn_and_names_the_billing_fields_that_changed(tmp_path):
    claude = tmp_path / "claude"
    claude.write_text(f"#!{sys.executable}\n{FAKE_CLAUDE}")
    claude.chmod(0o755)
    report, table = run(tmp_path, "--only", "claude_code", "--rounds", "1", "--warmup", "0", "--first-party",
                        "--claude", str(claude))
    result = report["summary"]["claude_code"]
    (turns,) = result["rounds"]
    assert list(turns) == ["first", "next 1", "next 2", "new conversation"]
    assert turns["first"]["cache_read_input_tokens"] == 0 and turns["next 1"]["cache_read_input_tokens"] > 0
    assert result["claude_version"] == "0.0.0 (stand-in)" and result["changing_fields"] == ["cch"]
    assert "| new conversation | " in table and "billing fields changing per request: cch" in table


def test_claude_code_itself_gets_its_tool_turn_and_its_cached_next_turns_on_their_own_rows(tmp_path):
    claude = os.environ.get("MTPSTACK_CLAUDE") or shutil.which("claude")
    if not claude:
        require("no `claude` binary on PATH or in MTPSTACK_CLAUDE (scripts/bootstrap-npm, run by scripts/test)")
    report, table = run(tmp_path, "--only", "claude_code", "--rounds", "1", "--warmup", "0", "--claude", claude)
    result = report["summary"]["claude_code"]
    (turns,) = result["rounds"]
    # The demo calls `Bash` on a conversation's first turn, so that turn is the call and the answer after its result.
    assert {"first", "first, after the tool's result", "next 1", "next 2", "new conversation"} <= set(turns)
    assert all(t["exit"] == 0 for t in turns.values())
    assert turns["first"]["cache_read_input_tokens"] == 0
    assert turns["next 1"]["cache_read_input_tokens"] > turns["next 1"]["prompt_tokens"] // 2
    assert "Claude Code" in result["claude_version"] and "(default mode)" in table
    assert "servers alternated" not in table  # no shared server ran
