"""`maxContextTokens` (`--max-context-tokens`): a real worker refuses what would run past the cap."""

from __future__ import annotations

import subprocess
import sys

import pytest

CAP = 64
PROMPT = [1] * 50


def completion(worker, **body):
    return worker.post_json("/v1/completions", {"model": "tiny", "prompt": PROMPT, "temperature": 0, **body})


def test_a_worker_capped_below_the_model_clamps_max_tokens_to_the_room_left_and_refuses_only_a_prompt_that_fills_it(
        tiny_pair, live_worker):
    with live_worker(*tiny_pair, width=1, max_context_tokens=CAP) as w:
        assert w.argv[w.argv.index("--max-context-tokens") + 1] == str(CAP)
        ident = w.get_json("/identity")
        assert (ident["context_length"], ident["max_context_tokens"]) == (CAP, CAP)

        # beyond the room left: a cap, cut to the room, the answer ends there
        status, _, body = completion(w, max_tokens=CAP - len(PROMPT) + 1, ignore_eos=True)
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == CAP - len(PROMPT)
        assert body["choices"][0]["finish_reason"] == "length"

        status, _, body = w.post_json("/v1/completions", {"model": "tiny", "prompt": [1] * CAP, "max_tokens": 1})
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert body["error"]["param"] == "prompt"  # the prompt is what does not fit, not `max_tokens`
        assert f"{CAP} tokens" in body["error"]["message"] and "--max-context-tokens" in body["error"]["message"]

        status, _, body = completion(w, max_tokens=CAP - len(PROMPT), ignore_eos=True)
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] <= CAP
        # without max_tokens the default is cut to the room left under the cap
        status, _, body = completion(w, ignore_eos=True)
        assert status == 200, body
        assert body["usage"]["completion_tokens"] <= CAP - len(PROMPT)


def test_a_cap_above_the_models_maximum_leaves_the_models_maximum(tiny_pair, live_worker):
    with live_worker(*tiny_pair, width=1) as plain:
        own = plain.get_json("/identity")["context_length"]
        assert plain.get_json("/identity")["max_context_tokens"] is None
    assert own is not None and own > CAP
    with live_worker(*tiny_pair, width=1, max_context_tokens=own * 4) as w:
        ident = w.get_json("/identity")
        assert (ident["context_length"], ident["max_context_tokens"]) == (own, own * 4)


def test_a_non_positive_cap_is_refused_before_loading():
    run = subprocess.run(
        [sys.executable, "-m", "mtpstack", "worker", "--model", "/nonexistent", "--max-context-tokens", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 1
    assert "`--max-context-tokens` must be at least 1: 0" in run.stderr


#: opencode 1.18's request to a custom OpenAI-compatible provider for a model it does not know: its
#: `OUTPUT_TOKEN_MAX` (32,000) as `max_tokens`, streamed, with its tools (shortened).
OPENCODE = {
    "model": "tiny", "max_tokens": 32000, "stream": True, "stream_options": {"include_usage": True}, "tool_choice": "auto",
    "messages": [{"role": "system", "content": "You are opencode, an interactive CLI tool. " * 4},
                 {"role": "user", "content": "list the files"}],
    "tools": [{"type": "function", "function": {"name": "bash", "description": "Runs a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}],
}
ROOMY_CAP = 512


@pytest.fixture(scope="module")
def roomy(tiny_pair, tmp_path_factory, live_worker_class):
    """A worker whose context is far below what agents ask for as output."""
    with live_worker_class(tmp_path_factory.mktemp("roomy"), *tiny_pair, width=1, max_context_tokens=ROOMY_CAP) as w:
        yield w


def _streamed_chat(w, body: dict) -> tuple[str | None, dict]:
    import openai

    client = openai.OpenAI(base_url=w.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    finish, usage = None, None
    for chunk in client.chat.completions.create(**body, extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        usage = chunk.usage or usage
    return finish, usage.model_dump()


@pytest.mark.parametrize("surface", ["chat", "chat max_completion_tokens", "completions", "responses", "messages"])
def test_a_clients_32000_token_ceiling_is_served_to_the_room_left_on_every_surface(roomy, surface):
    """opencode's shape (and Claude Code's 32,000) against a context far smaller: served, cut at the room left."""
    w = roomy
    if surface == "chat":
        finish, usage = _streamed_chat(w, OPENCODE)
        assert finish == "length" and usage["prompt_tokens"] + usage["completion_tokens"] == ROOMY_CAP
        return
    if surface == "chat max_completion_tokens":
        body = {k: v for k, v in OPENCODE.items() if k not in ("max_tokens", "stream", "stream_options")}
        status, _, answer = w.post_json("/v1/chat/completions", {**body, "max_completion_tokens": 32000, "ignore_eos": True})
        assert status == 200, answer
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"] == ROOMY_CAP
    elif surface == "completions":
        status, _, answer = completion(w, max_tokens=32000, ignore_eos=True)
        assert status == 200, answer
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"]["completion_tokens"] == ROOMY_CAP - len(PROMPT)
    elif surface == "messages":  # Claude Code's 32,000
        status, _, answer = w.post_json("/v1/messages?beta=true", {
            "model": "tiny", "max_tokens": 32000, "ignore_eos": True, "system": [{"type": "text", "text": "You are Claude Code."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "list the files"}]}]})
        assert status == 200, answer
        assert answer["stop_reason"] == "max_tokens"
        u = answer["usage"]
        assert u["input_tokens"] + u["cache_read_input_tokens"] + u["output_tokens"] == ROOMY_CAP
    else:
        status, _, answer = w.post_json("/v1/responses", {"model": "tiny", "input": "list the files",
                                                          "max_output_tokens": 32000, "ignore_eos": True})
        assert status == 200, answer
        assert answer["status"] == "incomplete" and answer["incomplete_details"] == {"reason": "max_output_tokens"}
        assert answer["usage"]["input_tokens"] + answer["usage"]["output_tokens"] == ROOMY_CAP


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 600}], "max_tokens": 32000}, "messages"),
    ("/v1/responses", {"input": "x " * 600, "max_output_tokens": 32000}, "input"),
    ("/v1/completions", {"prompt": [1] * 600, "max_tokens": 32000}, "prompt"),
])
def test_a_prompt_that_alone_does_not_fit_is_refused_naming_the_prompts_field(roomy, path, body, param):
    status, _, answer = roomy.post_json(path, {"model": "tiny", **body})
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert answer["error"]["param"] == param, answer
