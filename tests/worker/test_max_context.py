"""`maxContextTokens` (`--max-context-tokens`): a real worker refuses what would run past the cap."""

from __future__ import annotations

import re
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


#: A prompt longer than `ROOMY_CAP` in each OpenAI surface, and the field its refusal names.
TOO_LONG = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 600}], "max_tokens": 32000}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 600}], "stream": True}, "messages"),
    ("/v1/responses", {"input": "x " * 600, "max_output_tokens": 32000, "stream": True}, "input"),
    ("/v1/completions", {"prompt": [1] * 600, "max_tokens": 32000}, "prompt"),
]


@pytest.mark.parametrize("path, body, param", TOO_LONG)
def test_a_prompt_that_alone_does_not_fit_is_refused_in_openais_words_with_the_counts(roomy, path, body, param):
    """OpenAI's code and wording: Codex CLI compacts on `context_length_exceeded`; opencode and Claude Code
    (as an OpenAI client) match "maximum context length is N tokens" and "exceeds the context window"."""
    status, _, answer = roomy.post_json(path, {"model": "tiny", **body})
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param, answer
    message = answer["error"]["message"]
    tokens = int(re.search(r"resulted in (\d+) tokens", message).group(1))
    assert tokens > ROOMY_CAP and re.search(rf"maximum context length is {ROOMY_CAP} tokens\b", message), message
    assert f"Please reduce the length of the {'input' if param == 'input' else param}." in message
    assert ("exceeds the context window" in message) == (path == "/v1/responses")
    assert "--max-context-tokens" in message  # what limits it here: the worker's cap, not the model


def test_a_prompt_that_alone_does_not_fit_is_refused_in_anthropics_words(roomy):
    """Claude Code compacts the conversation on exactly this: 400 `invalid_request_error`, `prompt is too
    long: N tokens > M maximum` (it parses both numbers), the message whole, no field prefixed."""
    body = {"model": "tiny", "max_tokens": 32000, "stream": True, "system": [{"type": "text", "text": "You are Claude Code."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x " * 600}]}]}
    status, _, answer = roomy.post_json("/v1/messages?beta=true", body)
    assert status == 400 and answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error", answer
    found = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", answer["error"]["message"])
    assert found, answer
    tokens, maximum = int(found.group(1)), int(found.group(2))
    assert maximum == ROOMY_CAP - 1 and tokens > maximum  # the longest prompt that leaves room for one token
    status, _, counted = roomy.post_json("/v1/messages/count_tokens", {k: body[k] for k in ("model", "system", "messages")})
    assert status == 200 and counted["input_tokens"] == tokens, counted


def test_a_prompt_of_exactly_the_context_is_refused_and_one_token_less_is_served(roomy):
    """No room for one token of answer is a refusal; one token of room is an answer cut to it."""
    status, _, answer = roomy.post_json("/v1/completions", {"model": "tiny", "prompt": [1] * ROOMY_CAP, "max_tokens": 5})
    assert status == 400 and "resulted in 512 tokens" in answer["error"]["message"], answer
    status, _, answer = roomy.post_json("/v1/completions", {"model": "tiny", "prompt": [1] * (ROOMY_CAP - 1), "max_tokens": 5,
                                                            "ignore_eos": True})
    assert status == 200 and answer["usage"]["completion_tokens"] == 1, answer
