"""What `mtpstack up` prints when ready: each agent pointed at the proxy and told the window the workers serve."""

from __future__ import annotations

import json
import tomllib

from mtpstack.banner import agent_lines, ready_banner
from mtpstack.up import default_fleet
from mtpstack.validator import FleetConfig

URL = "http://127.0.0.1:8080"


def test_each_agent_is_told_the_window_its_model_is_served_with():
    lines = agent_lines(URL, "mtpstack-demo", 65536)
    claude = next(line for line in lines if "claude" in line and "ANTHROPIC_BASE_URL" in line).split()
    env = dict(word.split("=", 1) for word in claude[:-1])
    assert claude[-1] == "claude" and env == {
        "ANTHROPIC_BASE_URL": URL, "ANTHROPIC_AUTH_TOKEN": "x", "ANTHROPIC_MODEL": "mtpstack-demo",
        "ANTHROPIC_SMALL_FAST_MODEL": "mtpstack-demo", "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "65536"}
    start = lines.index("Codex CLI, in ~/.codex/config.toml:") + 1
    codex = tomllib.loads("\n".join(line.strip() for line in lines[start:lines.index("opencode, in opencode.json:")]))
    assert codex["model"] == "mtpstack-demo" and codex["model_provider"] == "mtpstack"
    assert codex["model_context_window"] == 65536 and codex["model_auto_compact_token_limit"] == 58982
    assert codex["model_providers"]["mtpstack"] == {"name": "mtpstack", "base_url": URL + "/v1", "wire_api": "responses"}
    opencode = json.loads(lines[-1])["provider"]["mtpstack"]
    assert opencode["options"]["baseURL"] == URL + "/v1" and opencode["npm"] == "@ai-sdk/openai-compatible"
    assert opencode["models"]["mtpstack-demo"]["limit"] == {"context": 65536, "output": 32000}


def test_the_banner_names_the_window_only_when_the_workers_said_it():
    config = FleetConfig.model_validate(default_fleet())
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in ready_banner(config)
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in ready_banner(config, None, {"another-model": 4096})
    banner = ready_banner(config, None, {"mtpstack-demo": 131072})
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW=131072 claude" in banner and "curl -s" in banner
    assert banner.splitlines()[-1] == "status: mtpstack status; stop: Ctrl-C"
