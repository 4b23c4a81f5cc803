"""Claude Code itself against `mtpstack up`'s demo: `claude -p` over Anthropic's Messages API, as its users
point it at a gateway (`ANTHROPIC_BASE_URL`, `ANTHROPIC_AUTH_TOKEN`, `ANTHROPIC_MODEL`). Runs where a
`claude` binary is on PATH (or named by `MTPSTACK_CLAUDE`; `scripts/test` installs one, and the latest the
npm registry serves as `MTPSTACK_CLAUDE_LATEST`); the request shapes it sends are tested everywhere
(tests/worker/test_messages.py, tests/protocol/test_messages.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mtpstack.up import DEMO_MODEL
from mtpstack import series
from tests.e2e.conftest import answered_requests, demo_config, get_text, metric, running_stack

CLAUDE = os.environ.get("MTPSTACK_CLAUDE") or shutil.which("claude")
#: The Claude Code a plain `npm install @anthropic-ai/claude-code` gives (`scripts/bootstrap-npm ... latest`).
CLAUDE_LATEST = os.environ.get("MTPSTACK_CLAUDE_LATEST")
pytestmark = pytest.mark.skipif(not CLAUDE, reason="no `claude` binary on PATH or in MTPSTACK_CLAUDE (scripts/bootstrap-npm, "
                                                   "run by scripts/test)")
ROOT = Path(__file__).resolve().parents[2]
REJECTED = series.REJECTED

#: Claude Code's first request is about 23,000 demo tokens with its tools; a busy 2-core machine
#: prefills it in one to three minutes.
TIMEOUT = 600
#: A window a test session outgrows: Claude Code's first turn here (its system prompt, tools and the
#: first message with its filler, then the tool round trip) fits, the next turn's filler does not.
SMALL_WINDOW = 30000


def claude(binary: str, args: list[str], cwd: Path, home: Path, stack, **env) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """One headless `claude` run against `stack`'s proxy in a scratch home: its exit and its stream-json events."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    clean.update(HOME=str(home), NO_COLOR="1", ANTHROPIC_BASE_URL=stack.proxy_url, ANTHROPIC_AUTH_TOKEN="unused",
                 ANTHROPIC_MODEL=DEMO_MODEL, ANTHROPIC_SMALL_FAST_MODEL=DEMO_MODEL, DISABLE_TELEMETRY="1", **env)
    done = subprocess.run([binary, *args, "--output-format", "stream-json", "--verbose"], cwd=cwd, env=clean,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
    return done, [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def proxy_requests(stack) -> list[dict]:
    return [r for r in (json.loads(line) for line in (stack.run_dir / "logs" / "proxy.log").read_text().splitlines()
                        if '"event": "request"' in line) if r["path"] == "/v1/messages"]


def ended(done: subprocess.CompletedProcess, events: list[dict]) -> dict:
    """The run's `result` event, once it is known to be a success with exit 0."""
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-4000:]}"
    [result] = [e for e in events if e.get("type") == "result"]
    assert result["subtype"] == "success" and not result["is_error"], result
    return result


@pytest.fixture(scope="module")
def demo_stack(tmp_path_factory):
    """The demo as `mtpstack up` ships it."""
    with running_stack(tmp_path_factory.mktemp("claude-stack"), demo_config()) as stack:
        yield stack


@pytest.fixture(scope="module")
def claude_turn(demo_stack, tmp_path_factory):
    """One `claude -p` turn through the demo as shipped: its exit, its events, the proxy's log of it."""
    tmp = tmp_path_factory.mktemp("claude")
    home, work = tmp / "home", tmp / "work"
    for d in (home, work):
        d.mkdir()
    (work / "notes.txt").write_text("hello\n")
    done, events = claude(CLAUDE, ["-p", "list the files", "--max-turns", "3", "--allowedTools", "Bash,Read"], work, home,
                          demo_stack, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    answered, _ = answered_requests(demo_stack.proxy_url, DEMO_MODEL)  # Claude Code exits on `message_stop`
    return done, events, answered, proxy_requests(demo_stack)


def test_claude_p_ends_its_turn_with_exit_0_through_the_demo(claude_turn):
    done, events, answered, requests = claude_turn
    ended(done, events)
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


def real_repository(dest: Path) -> Path:
    """A folder holding a real repository's git history: this project's own (a clone of the checkout),
    or, outside a git checkout, its files committed as a repository of their own."""
    if (ROOT / ".git").exists() and subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0:
        subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(dest)], check=True, timeout=300)
        return dest
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".venv*", ".claude-code*", ".codex-cli", ".clients-node", ".cache",
                                                              ".mtpstack", "__pycache__", "*.safetensors"))
    git = ["git", "-C", str(dest), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "--quiet"], check=True)
    for part in ("README.md", "docs", "."):
        subprocess.run([*git, "add", part], check=True)
        subprocess.run([*git, "commit", "--quiet", "-m", f"add {part}"], check=True)
    return dest


@pytest.mark.parametrize("which", ["pinned", "latest"])
def test_claude_code_in_a_real_repository_ends_its_turn(demo_stack, tmp_path, which):
    """Claude Code as a new user gets it (`npm install @anthropic-ai/claude-code`: the registry's latest)
    beside the pinned one, in a folder with a real repository's git history, with nothing switched off
    (its reachability probe `HEAD /api/hello` included): its prompt, larger than in an empty folder,
    fits the demo's context and the turn ends with exit 0."""
    binary = CLAUDE if which == "pinned" else CLAUDE_LATEST
    if not binary:
        pytest.skip("no latest Claude Code in MTPSTACK_CLAUDE_LATEST (scripts/bootstrap-npm ... latest, run by scripts/test)")
    work, home = real_repository(tmp_path / "repo"), tmp_path / "home"
    home.mkdir()
    before = len(proxy_requests(demo_stack))
    done, events = claude(binary, ["-p", "What is in this directory?", "--max-turns", "3", "--allowedTools", "Bash,Read"],
                          work, home, demo_stack)
    result = ended(done, events)
    assert result["num_turns"] >= 1 and result["result"].strip(), result
    requests = proxy_requests(demo_stack)[before:]
    assert requests and all(r["status"] == 200 for r in requests), [(r["status"], r["code"]) for r in requests]


def test_a_session_that_outgrows_the_window_compacts_and_ends_its_turn(tmp_path):
    """A worker whose context (`maxContextTokens`) the session's second turn no longer fits: the worker
    refuses it in Anthropic's words (`prompt is too long: N tokens > M maximum`), Claude Code compacts
    the conversation (`compact_boundary`), sends it again and ends its turn with exit 0. Nothing is
    cut to fit: the too-long request is refused, the compacted one served."""
    home, work, root = tmp_path / "home", tmp_path / "work", tmp_path / "stack"
    for d in (home, work, root):
        d.mkdir()
    (work / "notes.txt").write_text("hello\n")
    filler = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog near the river bank.\n" for i in range(110))
    with running_stack(root, demo_config(maxContextTokens=SMALL_WINDOW)) as stack:
        args = ["--max-turns", "3", "--allowedTools", "Bash,Read"]
        first, first_events = claude(CLAUDE, ["-p", "Keep these notes in mind:\n" + filler + "\nlist the files", *args], work,
                                     home, stack, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        ended(first, first_events)
        served = len(proxy_requests(stack))
        again, events = claude(CLAUDE, ["-c", "-p", "More notes:\n" + filler + "\nthanks", *args], work, home, stack,
                               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        requests = proxy_requests(stack)[served:]
        refusals = metric(get_text(stack.worker_url("demo") + "/metrics"), REJECTED, code="context_length_exceeded")
    ended(again, events)
    assert any(e.get("type") == "system" and e.get("subtype") == "compact_boundary" for e in events), \
        [e.get("subtype") or e.get("type") for e in events]
    refused = [r for r in requests if r["status"] == 400]
    # Anthropic's shape has no code: the proxy logs its type; the worker counts what it refused
    assert refused and all(r["code"] == "invalid_request_error" for r in refused), requests
    assert refusals == len(refused), (refusals, requests)
    assert requests[-1]["status"] == 200 and all(r["status"] in (200, 400) for r in requests), requests
