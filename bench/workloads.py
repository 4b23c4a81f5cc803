"""The agent workloads the benches send: `conversation`, fixed turns fed their answers (`agent_bench`,
`fleet_bench --routing`), and `make_workload`, the fleet's agent sessions, seeded so that every stack and round
gets the same requests byte for byte, with tool calls and results of the sizes asked for."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

TURNS = 6
ANSWER_TOKENS = 32
FOLLOW_UPS = ["open the failing test", "show me line 40", "fix the off-by-one", "run the tests again",
              "commit it", "summarize what changed"]
#: The context the servers are given for it (`mtpstack.bench.parts.longer_context`).
CONTEXT = 8192


def system_prompt(round_no: int, tools: int) -> str:
    """A coding agent's system prompt with `tools` tool lines; the round number first, so no round hits another's cache."""
    lines = [f"Session {round_no}. You are a coding agent working in a repository. Use the tools below; answer briefly."]
    for i in range(tools):
        lines.append(f"- tool_{i}(path: str, start: int = 0, end: int | None = None) -> str: read, search or edit "
                     f"the file at `path` between the given lines and return the result as plain text ({i}).")
    return "\n".join(lines)


def first_question(conversation: int) -> str:
    """One agent's several tasks: its conversations share the system prompt and differ right after it."""
    return f"Task {conversation}: what is failing?"


def opening(system: str, question: str = "what is failing?") -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def tool_pause(mean: float, rnd: int, conversation: int, turn: int) -> float:
    """Seconds the agent's tool runs before `turn`, uniform on 0 to twice `mean`, the same in every run of a round:
    pauses of seconds let workers go idle, so first-free can move a turn (at 0.3 s it kept 8 of 8; docs/proxy.md)."""
    if turn == 1 or mean <= 0:
        return 0.0
    return random.Random(f"{rnd}-{conversation}-{turn}").uniform(0, 2 * mean)


def tool_output(conversation: int, turn: int, lines: int) -> str:
    """`lines` lines a tool printed before `turn`, its own, so a conversation grows past the shared system prompt."""
    return "\n".join(f"src/task{conversation}/module_{turn}_{k}.py:{7 * k + turn}: "
                     f"assert parse(case_{conversation}_{k}) == {k * turn}" for k in range(lines))


def conversation(index: int, system: str, question: str, turns: int, *, pause: float = 0.0, rnd: int = 0,
                 output_lines: int = 0) -> Session:
    """The system prompt and `question`, then `FOLLOW_UPS`, each after a `tool_pause` and `output_lines` of output."""
    turns_ = [Turn(opening(system, question), 0.0)]
    for turn in range(2, turns + 1):
        follow_up = FOLLOW_UPS[(turn - 2) % len(FOLLOW_UPS)]
        if output_lines:
            follow_up = f"{tool_output(index, turn, output_lines)}\n\n{follow_up}"
        turns_.append(Turn([], tool_pause(pause, rnd, index, turn), follow_up))
    return Session(index, 0.0, turns_)


def turn_messages(previous: list[dict], turn: Turn, answer: str) -> list[dict]:
    """What a turn sends: its own messages, or the previous turn's, its answer and the follow-up."""
    if turn.follow_up is None:
        return turn.messages
    return [*previous, {"role": "assistant", "content": answer}, {"role": "user", "content": turn.follow_up}]


#: Characters per token of the tool outputs before `calibrate` measures the served tokenizer.
CHARS_PER_TOKEN = 2.4


def _tool(name: str, description: str, required: list[str], **properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS = [
    _tool("read_file", "Read a file of the repository, with line numbers.", ["path"],
          path={"type": "string", "description": "path relative to the repository root"},
          start={"type": "integer", "description": "first line (1-based)"},
          end={"type": "integer", "description": "last line, inclusive"}),
    _tool("run", "Run a shell command in the repository and return its output (stdout and stderr).", ["command"],
          command={"type": "string"}, timeout_s={"type": "integer", "description": "default 120"}),
    _tool("search", "Search the repository for a regular expression (ripgrep).", ["pattern"],
          pattern={"type": "string"}, path={"type": "string", "description": "a folder to search in"}),
    _tool("apply_patch", "Apply a unified diff to the repository.", ["patch"], patch={"type": "string"}),
]

SYSTEM = """You are a coding agent working in a software repository on the user's machine. You help the user
with software engineering tasks: fixing bugs, adding features, refactoring, explaining code.

# How you work
- Use the tools to look before you change anything: search for the code involved, read the files, run the
  tests that cover it. Never guess what a file contains.
- Keep changes small and focused on the task. Follow the conventions of the surrounding code: naming,
  formatting, error handling, the libraries already in use. Do not add dependencies without asking.
- After a change, run the relevant tests. If they fail, read the failure, fix the cause, and run them again.
  Do not weaken or delete a test to make it pass.
- When a command fails, read its output carefully before trying something else.
- Prefer `search` over reading whole directories; read only the lines you need of a long file.
- Apply edits with `apply_patch` as unified diffs with enough context lines to apply cleanly.

# Communication
- Be concise. Before a tool call, say in one short sentence what you are about to do and why.
- When the task is done, summarise what changed, which files, and how you verified it.
- If the task is ambiguous or a change would be risky (deleting data, rewriting history, touching
  credentials), stop and ask the user.

# Safety
- Never print or commit secrets. Do not run commands that reach the network unless the user asked.
- Do not run destructive commands (`rm -rf`, `git reset --hard`, `git push --force`) without the user's
  explicit approval.

# Repository notes
- Python 3.12, the package lives under `src/`, tests under `tests/` and run with `pytest -q`.
- Type hints everywhere; `ruff` for linting; docstrings in the imperative mood.
- Errors the user can fix are raised as `UserError` with a hint naming the fix."""

PACKAGES = ["buildkit", "ledger", "relay", "atlas", "quarry", "harbor"]
MODULES = ["manifest", "resolver", "cache", "scheduler", "config", "auth", "storage", "http_client", "parser",
           "metrics", "planner", "registry"]
VERBS = ["parse", "load", "resolve", "build", "merge", "validate", "render", "fetch", "store", "emit", "normalize", "apply"]
NOUNS = ["entry", "request", "manifest", "token", "record", "node", "header", "digest", "policy", "window", "batch", "target"]
TYPES = ["str", "int", "dict[str, str]", "list[Entry]", "Path", "bytes", "Manifest", "float | None"]
ERRORS = ["ValueError", "KeyError", "ManifestError", "ResolveError", "TimeoutError"]
TASKS = [
    "The test `{test}` fails since yesterday's merge. Find out why and fix it.",
    "`{func}` in `{path}` is slow on large inputs. Make it linear and keep the tests green.",
    "Add a `strict` flag to `{func}` in `{path}` that raises on unknown keys, with a test.",
    "Users report a crash in `{func}` when the input is empty. Reproduce it with a test and fix it.",
    "Rename `{func}` to `{func}_all` everywhere and update the callers and the docs.",
    "`{path}` has grown too large. Split the parsing helpers into their own module without changing behaviour.",
]


@dataclass
class Turn:
    """One request, sent `think_s` after the previous answer: the whole conversation (`messages`), or, fed its
    answers, `follow_up` after the previous turn's answer (`turn_messages`)."""

    messages: list[dict]
    think_s: float
    follow_up: str | None = None


@dataclass
class Session:
    index: int
    arrival_s: float
    turns: list[Turn] = field(default_factory=list)


def _until(rng: random.Random, chars: int, line) -> str:
    """Lines `line(rng, n)`, n from 0, until `chars` characters."""
    out, size, n = [], 0, 0
    while size < chars:
        text = line(rng, n)
        out.append(text)
        size += len(text) + 1
        n += 1
    return "\n".join(out)


def _func(rng: random.Random) -> str:
    return f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"


def _source_lines(rng: random.Random) -> list[str]:
    """One function of plausible Python: signature, docstring, a loop, error handling, a return."""
    name, arg, noun = _func(rng), rng.choice(NOUNS), rng.choice(NOUNS)
    err, typ = rng.choice(ERRORS), rng.choice(TYPES)
    body = [
        f"def {name}({arg}: {typ}, *, strict: bool = False) -> {rng.choice(TYPES)}:",
        f'    """{name.split("_")[0].capitalize()} the {noun} of `{arg}`; raise `{err}` when it is malformed."""',
        f"    if not {arg}:",
        f'        raise {err}(f"empty {noun}: {{{arg}!r}}")',
        "    result: dict[str, object] = {}",
        f"    for key, value in _items({arg}):",
        f"        if strict and key not in _KNOWN_{noun.upper()}S:",
        f'            raise {err}(f"unknown key {{key!r}} in {noun}")',
        f"        result[key] = _{rng.choice(VERBS)}_one(value, limit={rng.randint(2, 512)})",
    ]
    if rng.random() < 0.5:
        body += [f"    log.debug(\"{name}: %d keys\", len(result))"]
    return body + ["    return result", "", ""]


def file_contents(rng: random.Random, chars: int, path: str) -> str:
    """`read_file`: a Python module with line numbers, as `cat -n` prints it."""
    head = [f'"""{path.rsplit("/", 1)[-1][:-3].replace("_", " ").capitalize()}: {rng.choice(VERBS)} and '
            f'{rng.choice(VERBS)} {rng.choice(NOUNS)}s."""', "", "from __future__ import annotations", "",
            "import logging", "from pathlib import Path", "", "from .errors import " + ", ".join(sorted(set(ERRORS[2:]))),
            "", "log = logging.getLogger(__name__)", "", ""]
    lines = list(head)
    while sum(len(x) + 8 for x in lines) < chars:
        lines += _source_lines(rng)
    return _until(rng, chars, lambda _, n: f"{n + 1:6}\t{lines[n]}")


def pytest_output(rng: random.Random, chars: int, pkg: str) -> str:
    """`run pytest`: the session header, progress lines, one failure's traceback, the summary."""
    mod = rng.choice(MODULES)
    test, func = f"test_{_func(rng)}", _func(rng)
    failure = [
        "=================================== FAILURES ===================================",
        f"____________________________ {test} ____________________________", "",
        f"    def {test}():", f"        entry = make_{rng.choice(NOUNS)}(size={rng.randint(1, 64)})",
        f">       assert {func}(entry, strict=True) == EXPECTED", f"E       AssertionError: assert {{'a': 1, 'b': {rng.randint(2, 9)}}} == {{'a': 1, 'b': 2}}",
        "E         Differing items:", f"E         {{'b': {rng.randint(3, 9)}}} != {{'b': 2}}", "",
        f"tests/test_{mod}.py:{rng.randint(20, 400)}: AssertionError",
    ]
    tail = ["=========================== short test summary info ============================",
            f"FAILED tests/test_{mod}.py::{test} - AssertionError",
            f"==================== 1 failed, {rng.randint(40, 400)} passed, {rng.randint(0, 5)} skipped in {rng.uniform(1, 30):.2f}s ===================="]
    head = ["============================= test session starts ==============================",
            "platform linux -- Python 3.12.3, pytest-8.3.2, pluggy-1.5.0",
            f"rootdir: /home/dev/{pkg}", "configfile: pyproject.toml", f"collected {rng.randint(40, 400)} items", ""]
    fixed = sum(len(x) + 1 for x in head + failure + tail)

    def progress(r: random.Random, n: int) -> str:
        dots = "".join(r.choice("......................sF") for _ in range(r.randint(8, 40)))
        return f"tests/test_{r.choice(MODULES)}_{n}.py {dots:<44} [{min(99, 3 + n * 4):3}%]"

    middle = _until(rng, max(0, chars - fixed), progress) if chars > fixed else ""
    return "\n".join([*head, *([middle] if middle else []), "", *failure, *tail])


def search_hits(rng: random.Random, chars: int, pkg: str, pattern: str) -> str:
    """`search`: ripgrep's `path:line:text` lines."""
    def hit(r: random.Random, n: int) -> str:
        code = r.choice([f"    result = {pattern}({r.choice(NOUNS)}, strict={r.choice(['True', 'False'])})",
                         f"from .{r.choice(MODULES)} import {pattern}, {_func(r)}",
                         f"        return {pattern}(self.{r.choice(NOUNS)}s[key])",
                         f"    # {pattern} is called once per {r.choice(NOUNS)}: keep it cheap",
                         f"def test_{pattern}_{r.choice(NOUNS)}():"])
        where = f"tests/test_{r.choice(MODULES)}.py" if code.startswith("def test") else f"src/{pkg}/{r.choice(MODULES)}.py"
        return f"{where}:{r.randint(1, 900)}:{code}"
    return _until(rng, chars, hit)


def diff(rng: random.Random, chars: int, pkg: str) -> str:
    """`run git diff`: unified hunks of a change in progress."""
    def line(r: random.Random, n: int) -> str:
        if n % 12 == 0:
            mod = r.choice(MODULES)
            return (f"diff --git a/src/{pkg}/{mod}.py b/src/{pkg}/{mod}.py\nindex {r.getrandbits(28):07x}..{r.getrandbits(28):07x} 100644\n"
                    f"--- a/src/{pkg}/{mod}.py\n+++ b/src/{pkg}/{mod}.py")
        if n % 12 == 1:
            start = r.randint(1, 500)
            return f"@@ -{start},9 +{start},10 @@ def {_func(r)}("
        kind = r.choice("  -+")
        return f"{kind.strip() or ' '}{_source_lines(r)[r.randint(0, 8)]}"
    return _until(rng, chars, line)


def tool_step(rng: random.Random, step: int, pkg: str, chars: int) -> tuple[str, dict, str]:
    """(name, arguments, output of about `chars` characters) of a session's `step`-th tool call: a search first."""
    kind = "search" if step == 0 else rng.choice(["read_file", "read_file", "test", "diff", "search"])
    if kind == "search":
        pattern = _func(rng)
        return "search", {"pattern": pattern, "path": "src"}, search_hits(rng, chars, pkg, pattern)
    if kind == "read_file":
        path = f"src/{pkg}/{rng.choice(MODULES)}.py"
        return "read_file", {"path": path}, file_contents(rng, chars, path)
    if kind == "test":
        return "run", {"command": f"pytest -q tests/test_{rng.choice(MODULES)}.py"}, pytest_output(rng, chars, pkg)
    return "run", {"command": "git diff"}, diff(rng, chars, pkg)


def make_workload(seed: int, sizes: dict, chars_per_token: float = CHARS_PER_TOKEN) -> list[Session]:
    """A seed's sessions: arrivals a Poisson process of mean gap `arrival_s` from 0, tool outputs of
    `output_tokens` tokens (uniform, sized at `chars_per_token`), think times between turns."""
    rng, arrival, sessions = random.Random(f"fleet-{seed}"), 0.0, []
    for s in range(sizes["sessions"]):
        if s:
            arrival += rng.expovariate(1.0 / sizes["arrival_s"]) if sizes["arrival_s"] > 0 else 0.0
        srng = random.Random(f"fleet-{seed}-{s}")
        pkg = PACKAGES[s % len(PACKAGES)]
        path, func, test = f"src/{pkg}/{srng.choice(MODULES)}.py", _func(srng), f"test_{_func(srng)}"
        task = srng.choice(TASKS).format(path=path, func=func, test=test)
        messages = opening(SYSTEM, f"Repository `{pkg}`. {task}")
        session = Session(s, round(arrival, 3), [Turn(list(messages), 0.0)])
        for step in range(srng.randint(*sizes["turns"]) - 1):
            tokens = srng.randint(*sizes["output_tokens"])
            name, arguments, output = tool_step(srng, step, pkg, round(tokens * chars_per_token))
            call_id = f"call_{seed}_{s}_{step}"
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]},
                {"role": "tool", "tool_call_id": call_id, "content": output},
            ]
            session.turns.append(Turn(list(messages), round(srng.uniform(*sizes["think_s"]), 3)))
        sessions.append(session)
    return sessions


def tool_outputs(sessions: list[Session]) -> list[str]:
    return [m["content"] for s in sessions for m in s.turns[-1].messages if m["role"] == "tool"]


def calibrate(count_tokens, seed: int, sizes: dict) -> float:
    """Characters per token of the tool outputs under the served tokenizer, so outputs sized at it have the tokens asked."""
    outputs = tool_outputs(make_workload(seed, sizes))
    tokens = sum(map(count_tokens, outputs))
    return sum(map(len, outputs)) / tokens if tokens else CHARS_PER_TOKEN
