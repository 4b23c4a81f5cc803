"""Claude Code itself against `mtpstack up`'s demo: `claude -p` over Anthropic's Messages API, as its users
point it at a gateway (`ANTHROPIC_BASE_URL`, `ANTHROPIC_AUTH_TOKEN`, `ANTHROPIC_MODEL`). Runs where a
`claude` binary is on PATH (or named by `MTPSTACK_CLAUDE`; `scripts/test` installs one); the request
shapes it sends are tested everywhere (tests/worker/test_messages.py, tests/protocol/test_messages.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from mtpstack.runtime import free_port
from mtpstack.up import DEMO_MODEL, default_fleet
from tests.e2e.conftest import answered_requests, running_stack

CLAUDE = os.environ.get("MTPSTACK_CLAUDE") or shutil.which("claude")
pytestmark = pytest.mark.skipif(not CLAUDE, reason="no `claude` binary on PATH or in MTPSTACK_CLAUDE (scripts/bootstrap-npm, "
                                                   "run by scripts/test)")

#: Claude Code's first request is about 12,000 demo tokens with its tools; a busy 2-core machine
#: prefills it in one to three minutes.
TIMEOUT = 600


@pytest.fixture(scope="module")
def claude_turn(tmp_path_factory):
    """One `claude -p` turn through the demo as shipped: its exit, its events, the proxy's log of it."""
    tmp = tmp_path_factory.mktemp("claude")
    config = default_fleet()
    config["proxy"]["port"] = free_port()
    config["workers"]["demo"]["port"] = free_port()
    home, work, root = tmp / "home", tmp / "work", tmp / "stack"
    for d in (home, work, root):
        d.mkdir()
    (work / "notes.txt").write_text("hello\n")
    with running_stack(root, config) as stack:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
        env.update(HOME=str(home), NO_COLOR="1", ANTHROPIC_BASE_URL=stack.proxy_url, ANTHROPIC_AUTH_TOKEN="unused",
                   ANTHROPIC_MODEL=DEMO_MODEL, ANTHROPIC_SMALL_FAST_MODEL=DEMO_MODEL, DISABLE_TELEMETRY="1",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        done = subprocess.run(
            [CLAUDE, "-p", "list the files", "--max-turns", "3", "--allowedTools", "Bash,Read",
             "--output-format", "stream-json", "--verbose"],
            cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT,
        )
        answered, _ = answered_requests(stack.proxy_url, DEMO_MODEL)  # Claude Code exits on `message_stop`
        log = [json.loads(line) for line in (stack.run_dir / "logs" / "proxy.log").read_text().splitlines()
               if '"event": "request"' in line]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done, events, answered, [r for r in log if r["path"] == "/v1/messages"]


def test_claude_p_ends_its_turn_with_exit_0_through_the_demo(claude_turn):
    done, events, answered, requests = claude_turn
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-4000:]}"
    [result] = [e for e in events if e.get("type") == "result"]
    assert result["subtype"] == "success" and not result["is_error"], result
    statuses = [(r["status"], r["code"], r["duration_ms"]) for r in requests]
    assert answered and answered >= 1 and requests and all(r["status"] == 200 for r in requests), statuses


def test_claude_p_runs_a_tool_and_sends_its_result_back(claude_turn):
    """The demo answers "list the files" with a call of Claude Code's `Bash` tool (`tool_use`), Claude
    Code runs it and sends its output back (`tool_result`) in a second request, and the demo ends the
    turn in words: a whole tool round trip through the proxy."""
    done, events, _, requests = claude_turn
    blocks = [b for e in events if e.get("type") in ("assistant", "user") for b in e["message"].get("content", [])
              if isinstance(b, dict)]
    uses = [b for b in blocks if b.get("type") == "tool_use" and b.get("name") in ("Bash", "Read", "LS", "Glob")]
    results = [b for b in blocks if b.get("type") == "tool_result"]
    assert uses and results and len(requests) >= 2, blocks
    assert results[0]["tool_use_id"] == uses[0]["id"] and not results[0].get("is_error"), results
    assert "notes.txt" in json.dumps(results[0]["content"])
    [result] = [e for e in events if e.get("type") == "result"]
    assert result["num_turns"] >= 2 and result["result"].strip(), result
