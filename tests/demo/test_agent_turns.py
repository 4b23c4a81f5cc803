"""`devkit.demo.agent_turns`: Claude Code's and Codex CLI's own requests, recorded from the clients, made
into the demo's training turns: a call of the client's shell tool in the template's format, the real
command's output in the client's result shape, then a brief answer."""

from __future__ import annotations

import json

import numpy as np
import pytest

mlx_lm = pytest.importorskip("mlx_lm")

from devkit.demo import agent_turns  # noqa: E402
from mtpstack.worker.demo import DEMO_TARGET  # noqa: E402

pytestmark = pytest.mark.mlx

LINES = ["def parse(path):", "    return open(path).read()", "This program is free software.", "import os"]


@pytest.fixture(scope="module")
def tokenizer():
    return mlx_lm.load(str(DEMO_TARGET))[1]


@pytest.fixture(scope="module", params=list(agent_turns.CLIENTS))
def recording(request, tmp_path_factory):
    client = request.param
    if agent_turns.client_binary(client) is None:
        pytest.skip(f"no `{client}` binary (scripts/bootstrap-npm, run by scripts/test)")
    scratch = tmp_path_factory.mktemp(client)
    return agent_turns.record(client, scratch, "run", LINES, np.random.default_rng(0), files={"notes.txt": "hello\n"})


def test_a_recording_is_the_clients_request_and_the_next_one_with_the_tools_result(recording):
    tool, param = agent_turns.SHELL_TOOL[recording.client]
    names = [t.get("name") for t in recording.first["tools"]]
    assert tool in names
    if recording.client == "claude":
        result = recording.second["messages"][-1]["content"][-1]
        assert result["type"] == "tool_result" and "notes.txt" in result["content"]
        assert any(b.get("type") == "tool_use" and b["input"] == {param: "ls"}
                   for m in recording.second["messages"] for b in m["content"] if isinstance(b, dict))
    else:
        call, output = recording.second["input"][-2:]
        assert call["type"] == "function_call" and json.loads(call["arguments"]) == {param: "ls"}
        assert output["type"] == "function_call_output" and output["output"].endswith("Output:\nnotes.txt\n")


def test_a_request_to_act_is_answered_by_one_call_of_the_shell_tool_then_briefly(recording, tokenizer, tmp_path):
    from mtpstack.worker.protocol import messages, responses
    from mtpstack.worker.protocol.output import Markers, OutputSplitter

    (tmp_path / "todo.md").write_text("buy milk\nwrite tests\n")
    ep = agent_turns.episode(tokenizer, recording, 0, "show me todo.md", "cat todo.md", tmp_path)
    first, second = ep.turns
    assert first.call and not second.call
    # The prompts are the worker's own renderings of the client's requests, the request replaced.
    assert tokenizer.decode(first.prompt[ep.system :]).count("show me todo.md") == 1
    assert "list the files" not in tokenizer.decode(first.prompt[ep.system :])
    assert first.prompt[: len(ep.shared)] == second.prompt[: len(ep.shared)] == ep.shared
    # The answer is the template's own call format, which the worker parses into the shell tool's call.
    surface = messages if recording.client == "claude" else responses
    tools = surface.to_chat(recording.first)["tools"]
    splitter = OutputSplitter(Markers.of(tokenizer), False, tools, True)
    text = tokenizer.decode(first.answer)
    assert text.startswith("<tool_call>\n<function=") and text.endswith("</tool_call><|im_end|>")
    splitter.feed(text.removesuffix("<|im_end|>"))
    splitter.finish()
    tool, param = agent_turns.SHELL_TOOL[recording.client]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in splitter.calls] == [
        (tool, {param: "cat todo.md"})]
    # The next turn holds the command's real output and is answered with its first line.
    assert "buy milk\nwrite tests" in tokenizer.decode(second.prompt[len(ep.shared) :])
    assert tokenizer.decode(second.answer) == "buy milk<|im_end|>"


def test_a_request_that_needs_no_tool_is_answered_in_words_in_one_turn(recording, tokenizer, tmp_path):
    ep = agent_turns.episode(tokenizer, recording, 0, "say hi", None, tmp_path)
    [turn] = ep.turns
    assert not turn.call and tokenizer.decode(turn.answer) == "say hi<|im_end|>"
    # The request's end is found in the prompt, however far from its end the client put it.
    assert tokenizer.decode(ep.shared[ep.system : ep.request]).endswith("say hi")


def test_codexs_output_wrapper_counts_the_new_output():
    body = {"input": [{"type": "function_call", "arguments": "{}"},
                      {"type": "function_call_output", "output": "Chunk ID: ab12\nWall time: 0.1 seconds\n"
                       "Process exited with code 0\nOriginal token count: 3\nOutput:\nnotes.txt\n"}]}
    agent_turns._replace_call(body, "codex", "cat a.txt", "0123456789abcdef\n")
    assert json.loads(body["input"][0]["arguments"]) == {"cmd": "cat a.txt"}
    assert body["input"][1]["output"].endswith("Original token count: 5\nOutput:\n0123456789abcdef\n")


def test_the_brief_answer_is_the_outputs_first_line_cut_short():
    assert agent_turns.brief("\nnotes.txt\nother.txt\n") == "notes.txt"
    assert agent_turns.brief("") == "Done."
    long = agent_turns.brief("word " * 30)
    assert len(long) <= agent_turns.ANSWER_CHARS and long.endswith("word")


def test_requests_name_the_folders_files_and_some_need_no_tool():
    rng = np.random.default_rng(0)
    drawn = [agent_turns.sample_request(rng, ["notes.txt"]) for _ in range(300)]
    assert any(command is None for _, command in drawn) and any(command == "ls" for _, command in drawn)
    assert all("{" not in text for text, _ in drawn)
    assert all("notes.txt" in command for _, command in drawn if command and command.startswith("cat"))
