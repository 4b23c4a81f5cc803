"""Codex CLI itself against `mtpstack up`'s demo: a custom provider over the Responses API, one `codex exec`
turn that must end with exit 0 and a final message. Runs where a `codex` binary is on PATH (or named by
`MTPSTACK_CODEX`); the request shapes it sends are tested everywhere (tests/worker/test_codex_and_reasoning.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mtpstack.up import DEMO_MODEL
from tests.e2e.conftest import answered_requests, demo_config, running_stack

CODEX = os.environ.get("MTPSTACK_CODEX") or shutil.which("codex")
pytestmark = pytest.mark.skipif(not CODEX, reason="no `codex` binary on PATH or in MTPSTACK_CODEX (scripts/bootstrap-npm, run by scripts/test)")

#: Codex's first request is about 16,500 demo tokens with its tools; a busy 2-core machine
#: prefills it in about a minute.
TIMEOUT = 300


def codex_home(home: Path, stack, window_lines: str = "") -> Path:
    """A Codex home whose config points at `stack`'s proxy (`window_lines`: what it is told of the window)."""
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{DEMO_MODEL}"\nmodel_provider = "mtpstack"\n{window_lines}\n[model_providers.mtpstack]\n'
        f'name = "mtpstack"\nbase_url = "{stack.proxy_url}/v1"\nwire_api = "responses"\n'
    )
    return home


def codex(args: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(CODEX_HOME=str(home), HOME=str(home.parent), NO_COLOR="1")
    return subprocess.run([CODEX, "exec", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TIMEOUT)


def test_codex_exec_ends_its_turn_with_a_final_message(tmp_path):
    home, work, root = tmp_path / "codex-home", tmp_path / "work", tmp_path / "stack"
    for d in (work, root):
        d.mkdir()
    with running_stack(root, demo_config()) as stack:
        done = codex(["--skip-git-repo-check", "--color", "never", "say hi"], work, codex_home(home, stack))
        answered, counts = answered_requests(stack.proxy_url, DEMO_MODEL)  # Codex exits on `response.completed`
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-4000:]}"
    # `codex exec` prints the agent's final message, and only that, on stdout.
    assert done.stdout.strip(), done.stderr[-4000:]
    assert "Incomplete response" not in done.stderr
    assert answered and answered >= 1, counts


#: A window the test's session outgrows, and the point past which Codex is told to compact: its first
#: turn (its instructions and tools, about 16,500 demo tokens, then a message carrying ~3,000 tokens of
#: notes) passes the limit, and its next turn would not fit the window uncompacted. The notes ride in the
#: message, not in a tool's output, so the limit is passed whether or not the toy model calls a tool
#: (it does for some working directories' prompts and not for others: a listing made it flaky).
SMALL_WINDOW = 21000
COMPACT_LIMIT = 18000


def test_a_session_past_its_compaction_limit_compacts_and_goes_on_with_exit_0(tmp_path):
    """Codex is told the window as `mtpstack up` prints it (`model_context_window`,
    `model_auto_compact_token_limit`). Its turn's usage passes the limit with the long notes, so it
    compacts the conversation (its session file records a `compacted` item) and the turn, and the
    session's next turn (`codex exec resume --last`), end with exit 0: no request outgrew the window."""
    home, work, root = tmp_path / "codex-home", tmp_path / "work", tmp_path / "stack"
    for d in (work, root):
        d.mkdir()
    notes = "".join(f"note {i:03d}: about the quarterly planning meeting.\n" for i in range(150))  # ~3,000 demo tokens
    lines = f"model_context_window = {SMALL_WINDOW}\nmodel_auto_compact_token_limit = {COMPACT_LIMIT}\n"
    with running_stack(root, demo_config(maxContextTokens=SMALL_WINDOW)) as stack:
        home = codex_home(home, stack, lines)
        runs = [codex(["--skip-git-repo-check", "--color", "never", f"{notes}\nlist the files"], work, home),
                codex(["--skip-git-repo-check", "--color", "never", "resume", "--last", "thanks"], work, home)]
        _, counts = answered_requests(stack.proxy_url, DEMO_MODEL)
    for done in runs:
        assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-4000:]}"
        assert done.stdout.strip() and "ran out of room" not in done.stderr, done.stderr[-4000:]
    [session] = list((home / "sessions").rglob("rollout-*.jsonl"))
    records = [json.loads(line) for line in session.read_text().splitlines() if line.strip()]
    assert any(r.get("type") == "compacted" for r in records), [r.get("type") for r in records]
    assert 'status="400"' not in counts, counts  # compacted in time: nothing refused
