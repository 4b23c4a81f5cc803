"""Codex CLI itself against `mtpstack up`'s demo: a custom provider over the Responses API, one `codex exec`
turn that must end with exit 0 and a final message. Runs where a `codex` binary is on PATH (or named by
`MTPSTACK_CODEX`); the request shapes it sends are tested everywhere (tests/worker/test_codex_and_reasoning.py)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from mtpstack.runtime import free_port
from mtpstack.up import DEMO_MODEL, default_fleet
from tests.e2e.conftest import answered_requests, running_stack

CODEX = os.environ.get("MTPSTACK_CODEX") or shutil.which("codex")
pytestmark = pytest.mark.skipif(not CODEX, reason="no `codex` binary on PATH or in MTPSTACK_CODEX (scripts/bootstrap-npm, run by scripts/test)")

#: Codex's first request is about 16,500 demo tokens with its tools; a busy 2-core machine
#: prefills it in about a minute.
TIMEOUT = 300


def test_codex_exec_ends_its_turn_with_a_final_message(tmp_path):
    config = default_fleet()
    config["proxy"]["port"] = free_port()
    config["workers"]["demo"]["port"] = free_port()
    home, work, root = tmp_path / "codex-home", tmp_path / "work", tmp_path / "stack"
    for d in (home, work, root):
        d.mkdir()
    with running_stack(root, config) as stack:
        (home / "config.toml").write_text(
            f'model = "{DEMO_MODEL}"\nmodel_provider = "mtpstack"\n\n[model_providers.mtpstack]\n'
            f'name = "mtpstack"\nbase_url = "{stack.proxy_url}/v1"\nwire_api = "responses"\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
        env.update(CODEX_HOME=str(home), HOME=str(tmp_path), NO_COLOR="1")
        done = subprocess.run(
            [CODEX, "exec", "--skip-git-repo-check", "--color", "never", "say hi"],
            cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT,
        )
        answered, counts = answered_requests(stack.proxy_url, DEMO_MODEL)  # Codex exits on `response.completed`
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-4000:]}"
    # `codex exec` prints the agent's final message, and only that, on stdout.
    assert done.stdout.strip(), done.stderr[-4000:]
    assert "Incomplete response" not in done.stderr
    assert answered and answered >= 1, counts
