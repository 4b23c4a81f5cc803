"""What `mtpstack up` prints once the stack is ready (`ready_banner`): where to reach the fleet, a
first request to try, and how each agent (Claude Code, Codex CLI, opencode) is pointed at the proxy
and told the context window its worker serves (`agent_lines`)."""

from __future__ import annotations

import json

from mtpstack.runtime import url_of
from mtpstack.validator import FleetConfig, parts_on


#: Codex CLI compacts its conversation once a turn's tokens pass this share of the window it is told.
CODEX_COMPACT_SHARE = 0.9
#: The output cap opencode is told (Claude Code and opencode send 32,000; the worker cuts any cap to the room left).
OPENCODE_OUTPUT = 32000


def agent_lines(url: str, model: str, window: int) -> list[str]:
    """How each agent is pointed at the proxy on `url` and told the context `window` the worker serves for
    `model`, so it compacts its conversation before the window fills: Claude Code by
    `CLAUDE_CODE_AUTO_COMPACT_WINDOW`, Codex CLI by `model_context_window` (and the limit at which it
    compacts, `model_auto_compact_token_limit`), opencode by its model's `limit.context`. A prompt that
    still does not fit is refused in the words each of them compacts on (docs/agent-api.md)."""
    opencode = {"provider": {"mtpstack": {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": f"{url}/v1"},
                                          "models": {model: {"limit": {"context": window, "output": OPENCODE_OUTPUT}}}}}}
    return [
        f"Claude Code ({model}: a context of {window} tokens):",
        f"  ANTHROPIC_BASE_URL={url} ANTHROPIC_AUTH_TOKEN=x ANTHROPIC_MODEL={model} ANTHROPIC_SMALL_FAST_MODEL={model} "
        f"CLAUDE_CODE_AUTO_COMPACT_WINDOW={window} claude",
        "Codex CLI, in ~/.codex/config.toml:",
        f'  model = "{model}"',
        '  model_provider = "mtpstack"',
        f"  model_context_window = {window}",
        f"  model_auto_compact_token_limit = {int(window * CODEX_COMPACT_SHARE)}",
        "  [model_providers.mtpstack]",
        '  name = "mtpstack"',
        f'  base_url = "{url}/v1"',
        '  wire_api = "responses"',
        "opencode, in opencode.json:",
        "  " + json.dumps(opencode),
    ]


def ready_banner(config: FleetConfig, host: str | None = None, windows: dict[str, int] | None = None) -> str:
    """What `up` prints when ready: where to reach the fleet, and, for the first model whose context window
    is known (`windows`: the served model name -> the tokens its workers serve), each agent's line."""
    with_proxy, names = parts_on(config, host)
    if not with_proxy:
        proxy_host = config.proxy.deploy_on
        where = config.hosts[proxy_host].address if proxy_host in config.hosts else config.proxy.host
        return "\n".join([
            f"host `{host}` is up: " + (", ".join(f"worker `{n}`" for n in names) or "nothing placed here"),
            f"the proxy runs on host `{proxy_host}`: {url_of(where, config.proxy.port)}/v1",
            "status: mtpstack status; stop: Ctrl-C",
        ])
    url = url_of(config.proxy.host, config.proxy.port)
    model = config.models[0] if config.models else "MODEL"
    lines = [
        f"mtpstack is up: {url}/v1 (OpenAI API)",
        "models: " + ", ".join(config.models),
        "try:",
        f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' \\",
        f"    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"def fib(n):\"}}], \"max_tokens\": 32}}'",
    ]
    known = [m for m in config.models if (windows or {}).get(m)]
    if known:
        lines += agent_lines(url, known[0], windows[known[0]])
    lines.append("status: mtpstack status; stop: Ctrl-C")
    return "\n".join(lines)
