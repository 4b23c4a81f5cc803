"""Claude Code's and Codex CLI's own requests, recorded from the clients, made into turns to train the demo on.

The demo learns to act as these two agents ask a model to: a request to act on files or run a
command gets one call of the agent's shell tool (Claude Code's `Bash`, Codex's `exec_command`) in
the Qwen3.5 template's own `<tool_call>` format; after the tool's result, a brief answer (its
output's first line) and the end of the turn; a request that needs no tool gets a brief answer.

What the model reads is what these clients really send: `record` runs each client headless (`claude
-p`, `codex exec`) in a scratch folder against a small recording server (`Recorder`) that answers
the first request with a call of the shell tool and the next with a word, so the client runs the
tool itself and sends its result back. The two recorded requests of each run (the system prompt,
the tools with their schemas, the client's context turns, the `tool_use` / `tool_result` or
`function_call` / `function_call_output` shapes) are the templates of every training turn:
`turns` replaces only the user's request, the call and the tool's output (the output of the real
command, run in a folder of its own), and renders each request exactly as the worker does
(`to_chat` of the API's surface, then the chat template with the client's tools). Nothing of the
clients' text is stored in the repository: it is recorded when the recipe runs, from the pinned
versions `scripts/test` installs (`scripts/bootstrap-npm`).

The model is a 3.7M-parameter toy: what it learns is these few requests (`ACTIONS`, `CHATS`; the
live tests send "list the files" and "say hi"), not general competence.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from mtpstack.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
#: Each client: its binary's environment variable, where `scripts/test` installs it, its name on PATH.
CLIENTS = {
    "claude": ("MTPSTACK_CLAUDE", ROOT / ".claude-code" / "node_modules" / ".bin" / "claude"),
    "codex": ("MTPSTACK_CODEX", ROOT / ".codex-cli" / "node_modules" / ".bin" / "codex"),
}
#: The API each client speaks and the shell tool the demo calls in it, with its command parameter.
SHELL_TOOL = {"claude": ("Bash", "command"), "codex": ("exec_command", "cmd")}
#: A client run's time limit: start-up and two exchanges with the recorder.
RUN_SECONDS = 180
#: What the recorder answers once the tool's result is back.
RECORDED_ANSWER = "ok"

#: Requests to act, each with the command it asks for (`{f}`: a file of the folder).
ACTIONS = (
    ("list the files", "ls"), ("list the files in this folder", "ls"), ("list the files here", "ls"),
    ("what files are in this directory?", "ls"), ("show me the files", "ls"), ("which files are here?", "ls"),
    ("ls", "ls"), ("list the directory", "ls"), ("what is in this folder?", "ls"),
    ("list all the files, hidden ones too", "ls -a"), ("list the files with their sizes", "ls -l"),
    ("show me {f}", "cat {f}"), ("print {f}", "cat {f}"), ("read {f}", "cat {f}"), ("what is in {f}?", "cat {f}"),
    ("cat {f}", "cat {f}"), ("show the first lines of {f}", "head -n 5 {f}"),
    ("how many lines are in {f}?", "wc -l {f}"), ("count the lines of {f}", "wc -l {f}"),
    ("find the python files", "find . -name '*.py'"), ("search the files for TODO", "grep -rn TODO ."),
    ("run `{c}`", "{c}"), ("run {c}", "{c}"),
)
#: Commands a "run" request names.
RUN_COMMANDS = ("ls", "ls -a", "echo hello", "python3 --version", "wc -l *", "cat {f}", "head -n 3 {f}",
                "grep -n def {f}", "find . -type f", "du -sh .")
#: Requests that need no tool: answered in a few words.
CHATS = ("say hi", "hello", "hi there", "thanks", "good morning", "who are you?", "what can you do?",
         "tell me a joke", "what is 2 + 2?", "explain what a function is", "are you there?", "thank you!")
#: Files of a scratch folder: names and how many lines of a document each holds.
FILE_NAMES = ("notes.txt", "README.md", "main.py", "setup.cfg", "todo.md", "app.py", "LICENSE", "Makefile",
              "utils.py", "data.csv", "config.json", "test_main.py", "CHANGELOG", "index.html", "run.sh")
#: The longest answer after a tool's result: its output's first line, cut at a word boundary.
ANSWER_CHARS = 48
#: The request the check sends each client, as the live tests do, and whether it asks to act.
CHECK_REQUESTS = {"claude": (("list the files", "ls"), ("say hi", None)),
                  "codex": (("say hi", None), ("list the files in this folder", "ls"))}


class AgentTurnsError(UserError):
    """The clients could not be recorded."""


def client_binary(client: str) -> str | None:
    """The client's binary: its environment variable, else `scripts/test`'s install, else PATH."""
    variable, installed = CLIENTS[client]
    if os.environ.get(variable):
        return os.environ[variable]
    if installed.exists():
        return str(installed)
    return shutil.which(client)


# -- recording the clients ------------------------------------------------------------------------


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class Recorder:
    """A server in a thread that speaks just enough of Anthropic's Messages and OpenAI's Responses
    streams for a client's headless turn: a request with tools and no tool result yet is answered
    with `call` (name, arguments), any other with RECORDED_ANSWER. It keeps every request with tools."""

    def __init__(self, call: dict[str, tuple[str, dict]]):
        from mtpstack.runtime import free_port

        self.call = call
        self.bodies: list[dict] = []
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Recorder":
        self._thread.start()
        if not self._ready.wait(30):
            raise AgentTurnsError("the recording server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_route("*", "/{tail:.*}", self._other)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _other(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": []})

    async def _stream(self, request, events: list[tuple[str, dict]]):
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event, data in events:
            await response.write(_sse(event, data))
        await response.write_eof()
        return response

    async def _messages(self, request):
        body = await request.json()
        last = body["messages"][-1]["content"]
        answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if body.get("tools"):
            self.bodies.append(body)
        usage = {"input_tokens": 1, "output_tokens": 1}
        events = [("message_start", {"type": "message_start", "message": {
            "id": "msg_rec", "type": "message", "role": "assistant", "model": body.get("model"), "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}})]
        if body.get("tools") and not answered:
            name, args = self.call["claude"]
            block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(args)}
            stop = "tool_use"
        else:
            block, delta, stop = {"type": "text", "text": ""}, {"type": "text_delta", "text": RECORDED_ANSWER}, "end_turn"
        events += [("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
                   ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
                   ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                   ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 1}}),
                   ("message_stop", {"type": "message_stop"})]
        return await self._stream(request, events)

    async def _responses(self, request):
        body = await request.json()
        answered = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in body.get("input", []))
        if body.get("tools"):
            self.bodies.append(body)
        base = {"id": "resp_rec", "object": "response", "created_at": 0, "status": "in_progress",
                "model": body.get("model"), "output": []}
        if body.get("tools") and not answered:
            name, args = self.call["codex"]
            item = {"type": "function_call", "id": "fc_rec", "call_id": f"call_{uuid.uuid4().hex[:24]}", "name": name,
                    "arguments": json.dumps(args), "status": "completed"}
        else:
            item = {"type": "message", "id": "msg_rec", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": RECORDED_ANSWER, "annotations": []}]}
        usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0}}
        return await self._stream(request, [
            ("response.created", {"type": "response.created", "response": base}),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed",
                                    "response": {**base, "status": "completed", "output": [item], "usage": usage}})])


def _run_client(client: str, binary: str, request: str, url: str, home: Path, work: Path) -> subprocess.CompletedProcess:
    from mtpstack.up import DEMO_MODEL

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), NO_COLOR="1")
    if client == "claude":
        # As tests/e2e/test_claude_live.py runs it.
        env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_AUTH_TOKEN="unused", ANTHROPIC_MODEL=DEMO_MODEL,
                   ANTHROPIC_SMALL_FAST_MODEL=DEMO_MODEL, DISABLE_TELEMETRY="1",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        argv = [binary, "-p", request, "--max-turns", "3", "--allowedTools", "Bash,Read", "--output-format", "json"]
    else:
        # As tests/e2e/test_codex_live.py runs it.
        codex_home = home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(
            f'model = "{DEMO_MODEL}"\nmodel_provider = "mtpstack"\n\n[model_providers.mtpstack]\n'
            f'name = "mtpstack"\nbase_url = "{url}/v1"\nwire_api = "responses"\n')
        env["CODEX_HOME"] = str(codex_home)
        argv = [binary, "exec", "--skip-git-repo-check", "--color", "never", request]
    return subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=RUN_SECONDS)


def make_folder(path: Path, rng: np.random.Generator, lines: list[str], files: dict[str, str] | None = None) -> list[str]:
    """A scratch project folder: `files` (name: text), or a few small files of `lines` (of the training
    documents); their names."""
    path.mkdir(parents=True, exist_ok=True)
    if files is not None:
        for name, text in files.items():
            (path / name).write_text(text)
        return sorted(files)
    names = sorted(rng.choice(FILE_NAMES, size=int(rng.integers(1, 6)), replace=False).tolist())
    for name in names:
        start = int(rng.integers(0, max(1, len(lines) - 12)))
        (path / name).write_text("\n".join(lines[start : start + int(rng.integers(1, 12))]) + "\n")
    return names


@dataclass
class Recording:
    """One client run: its first request (before any tool ran) and its second (the call and its result)."""

    client: str
    request: str
    first: dict
    second: dict
    work: str  # the folder it ran in


def record(client: str, scratch: Path, name: str, lines: list[str], rng: np.random.Generator,
           files: dict[str, str] | None = None) -> Recording:
    """Run `client` once in a new folder `scratch/name` (its home beside it; its files `make_folder`'s),
    asking to list the files, and keep its two requests."""
    binary = client_binary(client)
    if binary is None:
        variable, installed = CLIENTS[client]
        raise AgentTurnsError(f"no `{client}` binary: teaching the demo to call tools records the real client's requests",
                              f"run `scripts/bootstrap-npm` as `scripts/test` does (it installs into `{installed.parent.parent.parent.name}/`), "
                              f"or set `{variable}`")
    work, home = scratch / name / "work", scratch / name / "home"
    make_folder(work, rng, lines, files)
    home.mkdir(parents=True, exist_ok=True)
    tool, param = SHELL_TOOL[client]
    with Recorder({client: (tool, {param: "ls"})}) as recorder:
        done = _run_client(client, binary, "list the files", recorder.url, home, work)
    if done.returncode != 0 or len(recorder.bodies) != 2:
        raise AgentTurnsError(f"`{client}` did not finish a recorded turn (exit {done.returncode}, "
                              f"{len(recorder.bodies)} requests): {(done.stderr or done.stdout)[-600:]}",
                              "check that the client runs: `" + " ".join([binary, "--version"]) + "`")
    return Recording(client, "list the files", recorder.bodies[0], recorder.bodies[1], str(work))


# -- turns built on a recording -------------------------------------------------------------------


def _replace_request(body: dict, client: str, old: str, new: str) -> None:
    """The user's request, where the client put it: Claude Code's text block of the first user
    message, Codex's last user message before any call."""
    if client == "claude":
        for message in body["messages"]:
            if message["role"] == "user" and isinstance(message["content"], list):
                for block in message["content"]:
                    if block.get("type") == "text" and block["text"] == old:
                        block["text"] = new
                        return
    else:
        for item in body["input"]:
            if item.get("type") == "message" and item.get("role") == "user":
                for part in item["content"]:
                    if part.get("type") == "input_text" and part["text"] == old:
                        part["text"] = new
                        return
    raise AgentTurnsError(f"`{client}`'s recorded request does not hold the user's request where expected",
                          "the client's request shape changed: see devkit/demo/agent_turns.py")


def _replace_call(body: dict, client: str, command: str, output: str) -> None:
    """The call of the shell tool and its result in a second request, in the client's own shapes:
    Claude Code sends the command's output as the `tool_result`'s text (without the last newline);
    Codex wraps it (`Chunk ID`, `Wall time`, exit code, `Original token count`, `Output:`)."""
    tool, param = SHELL_TOOL[client]
    if client == "claude":
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_use":
                    block["input"] = {**block["input"], param: command}
                elif block.get("type") == "tool_result":
                    block["content"] = output.rstrip("\n")
        return
    for item in body["input"]:
        if item.get("type") == "function_call":
            item["arguments"] = json.dumps({param: command})
        elif item.get("type") == "function_call_output":
            head, sep, _ = item["output"].partition("Output:\n")
            if not sep:
                raise AgentTurnsError("Codex's recorded tool output has no `Output:` line",
                                      "the client's output shape changed: see devkit/demo/agent_turns.py")
            head = re.sub(r"Original token count: \d+", f"Original token count: {math.ceil(len(output.encode()) / 4)}", head)
            item["output"] = head + sep + output


def run_command(command: str, folder: Path) -> str:
    """The command's real output in `folder` (stdout and stderr, as a terminal shows them)."""
    done = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(folder)})
    return done.stdout + done.stderr


def brief(output: str) -> str:
    """The answer after a tool's result: its first line, cut at a word boundary to ANSWER_CHARS."""
    first = next((line.strip() for line in output.splitlines() if line.strip()), "")
    if not first:
        return "Done."
    if len(first) <= ANSWER_CHARS:
        return first
    cut = first.rfind(" ", 0, ANSWER_CHARS + 1)
    return first[:cut].rstrip() if cut > ANSWER_CHARS // 3 else first[:ANSWER_CHARS]


def echo(request: str) -> str:
    """The answer to a request that needs no tool: the request's first line, as the demo's short chats answer."""
    return request.strip().splitlines()[0][:ANSWER_CHARS]


def sample_request(rng: np.random.Generator, files: list[str]) -> tuple[str, str | None]:
    """(request, the command it asks for, or None for one that needs no tool)."""
    if rng.random() < 0.3:
        text, command = CHATS[int(rng.integers(len(CHATS)))], None
    else:
        text, command = ACTIONS[int(rng.integers(len(ACTIONS)))]
        run = RUN_COMMANDS[int(rng.integers(len(RUN_COMMANDS)))]
        f = files[int(rng.integers(len(files)))]
        text, command = text.format(f=f, c=run.format(f=f)), command.format(f=f, c=run.format(f=f))
    style = rng.random()
    if style < 0.25:
        text = text[:1].upper() + text[1:]
    elif style < 0.4 and not text.endswith(("?", "!", "`")):
        text += rng.choice([".", "!", " please", ", please."])
    return text, command


@dataclass
class Turn:
    """A request as the worker would render it, and the answer to learn after it."""

    prompt: list[int]
    answer: list[int]  # the answer's tokens, then `<|im_end|>`
    call: bool  # the answer is a tool call


@dataclass
class Episode:
    """One request of one client: its first turn and, when it called the tool, its next turn after the result.

    `shared`: the tokens both turns' prompts begin with; `system`: where the client's system prompt
    and tools end in them (the same for every episode of a recording); `request`: the end of the
    user's request in them."""

    client: str
    recording: int
    shared: list[int]
    system: int
    request: int
    turns: list[Turn] = field(default_factory=list)


def render(tokenizer, client: str, body: dict) -> tuple[list[int], tuple[int, ...]]:
    """A recorded request rendered as the worker renders it: the surface's `to_chat`, then the chat
    request's prompt (template, tools). Returns (prompt tokens, where the leading system part ends)."""
    from mtpstack.worker.protocol import messages, responses
    from mtpstack.worker.protocol.chat import prepare

    surface = messages if client == "claude" else responses
    request = prepare(surface.to_chat(body), "chat", SimpleNamespace(tokenizer=tokenizer))
    return request.prompt, request.boundaries


def call_text(tokenizer, second: list[int]) -> str:
    """The assistant's call as the template renders it in the second turn's history: what the model writes."""
    text = tokenizer.decode(second)
    head = "<|im_start|>assistant\n"
    at = text.rfind(head, 0, text.rfind("<tool_response>"))
    if at < 0 or "<|im_end|>" not in text[at:]:
        raise AgentTurnsError("the second turn's history does not hold the call where expected",
                              "the template's turn format changed: see devkit/demo/agent_turns.py")
    return text[at + len(head): text.index("<|im_end|>", at)].lstrip("\n")


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _request_end(tokenizer, prompt: list[int], request: str, start: int) -> int:
    """The token just after the last occurrence of `request` in `prompt[start:]`."""
    text = tokenizer.decode(prompt[start:])
    at = text.rfind(request)
    if at < 0:
        raise AgentTurnsError("the rendered prompt does not hold the user's request",
                              "see devkit/demo/agent_turns.py: `_request_end`")
    want = at + len(request)
    lo, hi = start, len(prompt)
    while lo < hi:  # the first end whose decoded text covers the request
        mid = (lo + hi) // 2
        if len(tokenizer.decode(prompt[start:mid])) >= want:
            hi = mid
        else:
            lo = mid + 1
    return lo


def episode(tokenizer, recording: Recording, index: int, request: str, command: str | None, folder: Path) -> Episode:
    """The turns of `request` on `recording`'s requests: the first answered with a call of the shell
    tool running `command` (run for real in `folder`), the second after its output with `brief` of it;
    or, without a command, the first answered with `echo` of the request."""
    import copy

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    client = recording.client
    first = copy.deepcopy(recording.first)
    _replace_request(first, client, recording.request, request)
    prompt1, bounds = render(tokenizer, client, first)
    if not bounds:
        raise AgentTurnsError(f"`{client}`'s recorded request has no system part the worker could cache",
                              "see devkit/demo/agent_turns.py")
    if command is None:
        answer = list(tokenizer.encode(echo(request), add_special_tokens=False)) + [end]
        at = _request_end(tokenizer, prompt1, request, bounds[0])
        return Episode(client, index, prompt1, bounds[0], at, [Turn(prompt1, answer, False)])
    second = copy.deepcopy(recording.second)
    _replace_request(second, client, recording.request, request)
    output = run_command(command, folder)
    _replace_call(second, client, command, output)
    prompt2, _ = render(tokenizer, client, second)
    shared = _common(prompt1, prompt2)
    call = list(tokenizer.encode(call_text(tokenizer, prompt2), add_special_tokens=False)) + [end]
    said = list(tokenizer.encode(brief(output), add_special_tokens=False)) + [end]
    at = _request_end(tokenizer, prompt1[:shared], request, bounds[0])
    return Episode(client, index, prompt1[:shared], bounds[0], at,
                   [Turn(prompt1, call, True), Turn(prompt2, said, False)])
