"""The agent-facing request fields: history with tool calls, `tools`/`tool_choice`, reasoning,
`chat_template_kwargs`, `response_format` and logprobs, checked and turned into a prompt, an
output splitter's settings and a logits hook.

Every refusal is a `ProtocolError` naming the field; the server answers it as a 400. A request's
grammar is built and compiled afterwards, off the event loop (`compile_constraint`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import partial
from typing import Callable

from mtpstack.validator import BodyError, parse_json_body
from mtpstack.worker.protocol import generic
from mtpstack.worker.protocol.grammar import GrammarError, Grammars, json_grammar, source_key, tool_grammar
from mtpstack.worker.protocol.hooks import MAX_TOP_LOGPROBS, BanTokens, Constraint, RowHook, ThinkBudget
from mtpstack.worker.protocol.output import Markers
from mtpstack.worker.protocol.schema import MAX_STRING_CHARS, string_cap

#: Tools a request may declare: agent frameworks send tens; the prompt pays for every one.
MAX_TOOLS = 128
#: Keys of `chat_template_kwargs` the worker sets itself.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "tokenize", "conversation",
                                      "chat_template", "return_dict", "continue_final_message"})
#: Completions' integer `logprobs`: OpenAI's own bound.
MAX_COMPLETION_LOGPROBS = 5
ROLES = {"system", "developer", "user", "assistant", "tool"}
#: OpenAI's `reasoning_effort` values; the first two turn the template's thinking off.
REASONING_OFF = ("none", "minimal")
REASONING_EFFORTS = (*REASONING_OFF, "low", "medium", "high", "xhigh")
#: The reasoning budget when the request sets none but forces structure after the reasoning (a
#: tool call or a schema): half of `max_tokens`, at most this many tokens, so the structure always
#: gets the other half.
DEFAULT_REASONING_BUDGET = 2048


class ProtocolError(ValueError):
    def __init__(self, message: str, param: str, code: str = "invalid_request"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass
class OutputSpec:
    """How the answer's text is split: see `mtpstack.worker.protocol.output.OutputSplitter`."""

    markers: Markers
    reasoning: bool = False
    tools: list | None = None
    parse_tools: bool = False


@dataclass
class PendingGrammar:
    """A request's grammar, not built yet: `compile_constraint` has it built and compiled off the
    event loop (building a large schema's grammar alone takes milliseconds)."""

    #: Builds the grammar for a bound on unbounded strings (`schema.string_cap`).
    make: Callable[[int], str]
    param: str  # the field a refusal names: `response_format` or `tool_choice`
    think_end: int | None  # the token that ends the reasoning, when the prompt opened it
    reasoning: bool
    #: The bound the grammar is built with: the longest unless the answer's tokens are fewer (`fit`).
    cap: int = MAX_STRING_CHARS
    #: What it is built from, as text (`grammar.source_key`): how a compiled one is found. Set by
    #: `fit`, on the thread that parses the request (a large tool set is megabytes of JSON).
    key: str = ""


@dataclass
class AgentRequest:
    prompt: list[int] | None  # None: not a chat (the caller tokenizes)
    output: OutputSpec | None
    hook: RowHook | None
    logprobs_shape: str | None  # "chat", "completion" or None
    #: Prompt positions worth a prefix-cache snapshot (`conversation_boundaries`): where the leading
    #: system messages end, and where the conversation's last message ends.
    boundaries: tuple[int, ...] = ()
    grammar: PendingGrammar | None = None
    #: The prompt opened a think block this id ends (None: no reasoning to budget).
    think_end: int | None = None
    #: `max_reasoning_tokens`, when the request set it.
    reasoning_budget: int | None = None

    def fit(self, max_tokens: int) -> None:
        """Fit the answer's parts into `max_tokens`, once it is known. The reasoning budget goes on
        the hook: the request's own, else, when structure is forced after the reasoning,
        `DEFAULT_REASONING_BUDGET` or half of `max_tokens`. The structure's unbounded strings get
        half the tokens left after that (`schema.string_cap`)."""
        budget = self.reasoning_budget if self.think_end is not None else None
        if budget is None and self.think_end is not None and self.grammar is not None:
            budget = min(DEFAULT_REASONING_BUDGET, max_tokens // 2)
        if budget is not None:
            hook = self.hook or RowHook()
            hook.budget = ThinkBudget(self.think_end, budget)
            self.hook = hook
        pending = self.grammar
        cap = string_cap(max_tokens - min(budget or 0, max_tokens))
        if pending is not None:
            pending.cap = min(cap, MAX_STRING_CHARS)
            pending.key = source_key(partial(pending.make, pending.cap))


_grammars: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def grammars_for(engine) -> Grammars:
    if engine not in _grammars:
        _grammars[engine] = Grammars(engine.tokenizer, engine.vocab_size)
    return _grammars[engine]


def tool_list(tools) -> list | None:
    """Another API's `tools` as sent (None when absent), refused unless a list."""
    if tools is not None and not isinstance(tools, list):
        raise ProtocolError("`tools` must be a list", "tools")
    return tools


def reword_refusal(param: str | None, message: str, *, tool_field: str, flat_tool_field: str, messages: str,
                   renamed: dict[str, str]) -> tuple[str | None, str]:
    """A refusal of the translated chat request, reworded about the field the client of another API sent:
    `tools[i]<tool_field>...` is `tools[i]<flat_tool_field>...` there, any chat message is `messages`,
    and the other chat fields are `renamed`."""
    if param is None:
        return None, message
    if param.startswith("tools[") and tool_field in param:
        flat = param.replace(tool_field, flat_tool_field, 1)
        return flat, message.replace(param, flat)
    if param.startswith("messages["):
        return messages, message
    return renamed.get(param, param), message


def content_text(content, where: str, param: str = "messages") -> str:
    """A message's text: a string, None, or a list of text parts (chat's `text`, Responses' `input_text`/`output_text`)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text") \
                    or not isinstance(part.get("text"), str):
                raise ProtocolError(f"only text content parts are supported: {where}", param, "unsupported_parameter")
            parts.append(part["text"])
        return "".join(parts)
    raise ProtocolError(f"message content must be a string or a list of text parts: {where}", param)


def tool_arguments(args, param: str) -> dict:
    """A call's `arguments` as an object: given as one, or as JSON text of one, read under the
    request body's own bounds (nesting, digits); `param` names the field in a refusal."""
    if isinstance(args, str):
        try:
            args = parse_json_body(args, what=f"`{param}`") if args.strip() else {}
        except BodyError as e:
            raise ProtocolError(str(e), param) from None
    if not isinstance(args, dict):
        raise ProtocolError(f"`{param}` must be a JSON object (or its JSON text): {shown(args)}", param)
    return args


def shown(value) -> str:
    """A client's value inside a message: short, so an error never echoes a megabyte back."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def optional_string(value, param: str) -> str | None:
    """A string field that may be absent; any other type is refused, naming it."""
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"`{param}` must be a string: {shown(value)}", param)
    return value


def _call_in_history(call, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ProtocolError(f"each tool call needs a `function` with a string `name`: {where}", "messages")
    args = tool_arguments(fn.get("arguments", {}), f"{where}.function.arguments")
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if (call_id := optional_string(call.get("id"), f"{where}.id")) is not None:
        out["id"] = call_id
    return out


def normalize_messages(messages) -> list[dict]:
    """The history as chat templates read it: text content, `tool_calls` with object arguments,
    `tool` messages with their `tool_call_id`, and reasoning as `reasoning_content` (the field the
    family's templates render; `reasoning` is accepted too)."""
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("`messages` must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ProtocolError(f"each message needs a string `role`: {where}", "messages")
        role = m["role"]
        if role not in ROLES:
            raise ProtocolError(f"unknown role `{role[:40]}`: {where}", "messages")
        msg = {"role": "system" if role == "developer" else role, "content": content_text(m.get("content"), where)}
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise ProtocolError(f"`tool_calls` must be a list: {where}", "messages")
                msg["tool_calls"] = [_call_in_history(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            if reasoning is not None:
                msg["reasoning_content"] = content_text(reasoning, where)
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if (value := optional_string(m.get(key), f"{where}.{key}")) is not None:
                    msg[key] = value
        out.append(msg)
    return out


def _tools(body) -> list[dict] | None:
    tools = body.get("tools")
    if tools in (None, []):
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ProtocolError(f"`tools` must be a list of at most {MAX_TOOLS} tools", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ProtocolError(f"each tool must be `{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}`: tools[{i}]", "tools")
        _parameters(fn.get("parameters"), f"tools[{i}].function.parameters")
    return tools


def _parameters(params, param: str) -> None:
    """A tool's `parameters`: a JSON schema object whose `properties` are schemas and whose
    `required` names strings, as templates and the forced-call grammar read them."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise ProtocolError(f"`{param}` must be a JSON schema object: {shown(params)}", param)
    props = params.get("properties")
    if props is not None and (not isinstance(props, dict) or not all(isinstance(v, (dict, bool)) for v in props.values())):
        raise ProtocolError(f"`{param}.properties` must map each parameter name to a JSON schema", f"{param}.properties")
    required = params.get("required")
    if required is not None and (not isinstance(required, list) or not all(isinstance(r, str) for r in required)):
        raise ProtocolError(f"`{param}.required` must be a list of parameter names: {shown(required)}", f"{param}.required")


def _tool_choice(body, tools):
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise ProtocolError(f"`tool_choice` must be `auto`, `none`, `required` or a named function: {choice[:40]!r}", "tool_choice")
        if choice == "required" and not tools:
            raise ProtocolError("`tool_choice` is `required` but no `tools` are given", "tool_choice")
        return choice
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ProtocolError("a named `tool_choice` must be `{\"type\": \"function\", \"function\": {\"name\": ...}}`", "tool_choice")
    if not any(t["function"]["name"] == name for t in tools or []):
        raise ProtocolError(f"`tool_choice` names a function that is not in `tools`: `{name[:100]}`", "tool_choice")
    return name


def _template_kwargs(body) -> dict:
    kw = body.get("chat_template_kwargs")
    if kw is None:
        return {}
    if not isinstance(kw, dict) or not all(isinstance(k, str) for k in kw):
        raise ProtocolError("`chat_template_kwargs` must be an object", "chat_template_kwargs")
    if reserved := sorted(RESERVED_TEMPLATE_KWARGS & kw.keys()):
        raise ProtocolError(f"`chat_template_kwargs` may not set `{reserved[0]}`", "chat_template_kwargs")
    return kw


def response_grammar(body) -> Callable[[int], str] | None:
    """`response_format`'s grammar, as a function of the bound on unbounded strings (built, and so
    checked, by `compile_constraint`)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    make = None
    if kind == "text":
        return None
    if kind == "json_object":
        make = partial(json_grammar, None)
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ProtocolError("`response_format.json_schema.schema` must be a JSON schema object", "response_format")
        make = partial(json_grammar, spec["schema"])
    if make is None:
        raise ProtocolError("`response_format.type` must be `text`, `json_object` or `json_schema`", "response_format")
    return make


def _reasoning(body, tok, kwargs: dict) -> int | None:
    """`reasoning_effort` turns the template's thinking switch (unless `chat_template_kwargs` sets
    `enable_thinking` itself); returns `max_reasoning_tokens`, checked."""
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise ProtocolError(f"`reasoning_effort` must be one of {', '.join(REASONING_EFFORTS)}: {shown(effort)}",
                                "reasoning_effort")
        if getattr(tok, "has_thinking", False):
            kwargs.setdefault("enable_thinking", effort not in REASONING_OFF)
    budget = body.get("max_reasoning_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise ProtocolError(f"`max_reasoning_tokens` must be a non-negative integer: {shown(budget)}", "max_reasoning_tokens")
    return budget


def _logprobs(body, kind: str) -> tuple[int | None, str | None]:
    lp = body.get("logprobs")
    if kind == "chat":
        if lp is not None and not isinstance(lp, bool):
            raise ProtocolError(f"`logprobs` must be a boolean: {str(lp)[:40]}", "logprobs")
        top = body.get("top_logprobs")
        if top is not None:
            if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
                raise ProtocolError(f"`top_logprobs` must be an integer from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
            if not lp:
                raise ProtocolError("`top_logprobs` needs `logprobs: true`", "top_logprobs")
        return (top or 0, "chat") if lp else (None, None)
    if lp is None or lp is False:
        return None, None
    if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_COMPLETION_LOGPROBS:
        raise ProtocolError(f"`logprobs` must be an integer from 0 to {MAX_COMPLETION_LOGPROBS}", "logprobs")
    return lp, "completion"


def _tool_format(tokenizer) -> str | None:
    parser = getattr(tokenizer, "tool_parser", None)
    return parser.__module__.rsplit(".", 1)[-1] if parser is not None else None


def _single_id(tokenizer, text: str | None) -> int | None:
    if not text:
        return None
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def prepare(body: dict, kind: str, engine) -> AgentRequest:
    """The agent fields of a chat (`kind` "chat") or completions ("text") request."""
    tok = engine.tokenizer
    top, shape = _logprobs(body, kind)
    grammar = response_grammar(body)
    prompt = output = None
    boundaries: tuple[int, ...] = ()
    ban = budget = None
    reasoning = False
    if kind == "chat":
        tools = _tools(body)
        choice = _tool_choice(body, tools)
        messages = normalize_messages(body.get("messages"))
        kwargs = dict(_template_kwargs(body))
        budget = _reasoning(body, tok, kwargs)
        markers, fmt, shown_tools = Markers.of(tok), _tool_format(tok), tools
        if not getattr(tok, "has_tool_calling", False) and (tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)):
            # No tool-call format in the template: the generic one, described in a system message.
            markers, fmt, shown_tools = generic.markers(tok), generic.GENERIC, None
            messages = generic.rewrite(messages, tools if choice != "none" else None)
        prompt = template_prompt(tok, messages, shown_tools, kwargs)
        boundaries = conversation_boundaries(tok, messages, shown_tools, kwargs, prompt)
        if getattr(tok, "has_thinking", False) and tok.think_end_tokens:
            reasoning = tok.rfind_think_start(prompt) > tok.rfind_think_end(prompt)
        output = OutputSpec(markers, reasoning, tools, parse_tools=choice != "none" and tools is not None)
        if choice not in ("auto", "none"):
            if grammar is not None:
                raise ProtocolError("`response_format` cannot be combined with a forced tool call", "response_format")
            chosen = tools if choice == "required" else [t for t in tools if t["function"]["name"] == choice]
            grammar = partial(tool_grammar, chosen, fmt)
        elif choice == "none" and tools and fmt != generic.GENERIC and (tid := _single_id(tok, tok.tool_call_start)) is not None:
            ban = BanTokens([tid])
    pending = None
    if grammar is not None:
        param = "tool_choice" if kind == "chat" and body.get("tool_choice") not in (None, "auto", "none") else "response_format"
        think_end = _single_id(tok, getattr(tok, "think_end", None)) if reasoning else None
        pending = PendingGrammar(grammar, param, think_end, reasoning)
    hook = RowHook(top, ban) if (top is not None or ban is not None) else None
    think_end = _single_id(tok, getattr(tok, "think_end", None)) if reasoning else None
    return AgentRequest(prompt, output, hook, shape, boundaries, pending, think_end, budget)


def conversation_boundaries(tok, messages, tools, kwargs, prompt: list[int]) -> tuple[int, ...]:
    """Where a rendered conversation is worth a prefix-cache snapshot: the one way every endpoint that
    renders messages with the chat template (chat, Responses, any other) finds them.

    - Where the leading system (or developer) messages end: a system prompt with its tools, which
      other conversations share.
    - Where the last message ends, before the generation prompt: the next turn's prompt is this
      conversation with the answer and new messages appended, and the generation prompt is where it
      diverges (the Qwen3.5 family's ends `<|im_start|>assistant\n<think>\n\n</think>\n\n`, the
      history renders that turn without the empty think block), so the next turn resumes here and
      prefills only what is new.

    Each is found by rendering those messages alone (`add_generation_prompt=False`) and kept only
    when it is a strict prefix of `prompt`'s tokens; a template that refuses the shorter render
    gives no boundary there, nothing else is lost."""
    if not tok.has_chat_template:
        return ()
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
        lead += 1
    found = []
    for upto in sorted({lead, len(messages)} - {0}):
        try:
            head = render_template(tok, messages[:upto], tools, kwargs, add_generation_prompt=False)
        except Exception:  # a template may refuse a conversation without a user turn
            continue
        if isinstance(head, dict):
            head = head["input_ids"]
        n = len(head)
        if 0 < n < len(prompt) and [int(t) for t in head] == prompt[:n]:
            found.append(n)
    return tuple(found)


async def compile_constraint(agent: AgentRequest, engine, client: str = "") -> None:
    """Build and compile the request's grammar on the compile threads, in `client`'s turn, and set
    its constraint on the hook. A grammar that cannot be built or compiled, or not within its
    compile time, is a `ProtocolError` naming its field; one the worker is too busy to start is
    `grammar.Busy` (nothing is wrong with it)."""
    pending = agent.grammar
    if pending is None:
        return
    g = grammars_for(engine)
    try:
        matcher = await g.compile(partial(pending.make, pending.cap), client=client, key=pending.key or None)
    except GrammarError as e:
        raise ProtocolError(f"`{pending.param}` cannot be enforced: {e}", pending.param) from None
    constraint = Constraint(matcher, g.vocab_size, pending.think_end, pending.reasoning,
                            tuple(sorted(engine.eos_token_ids)))
    old = agent.hook
    agent.hook = RowHook(old.top_logprobs if old is not None else None, constraint, old.budget if old is not None else None)
    agent.grammar = None


def render_template(tok, messages, tools, kwargs: dict, *, add_generation_prompt: bool):
    """The chat template applied as transformers applies it: a thinking switch the request leaves
    unset is left to the template's own default. (mlx-lm's wrapper sets `enable_thinking` to whether
    the vocabulary has think markers, which would override a template whose default is off, such
    as the shipped demo's; the real Qwen3.5 templates default to on, so for them nothing changes.)"""
    inner = getattr(tok, "_tokenizer", None)
    if ("enable_thinking" not in kwargs and getattr(tok, "_chat_template", None) is None
            and getattr(tok, "_thinking_kwarg", None) == "enable_thinking" and inner is not None):
        return inner.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                         tokenize=True, return_dict=False, **kwargs)
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True,
                                   **kwargs)


def template_prompt(tok, messages, tools=None, kwargs: dict | None = None) -> list[int]:
    """The prompt's tokens: the chat template applied to `messages` with the generation prompt (a
    tokenizer without a template: `role: content` lines, then `assistant:`)."""
    kwargs = kwargs or {}
    if not tok.has_chat_template:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return list(tok.encode(text))
    try:
        tokens = render_template(tok, messages, tools, kwargs, add_generation_prompt=True)
    except Exception as e:  # third-party template code fed client input
        raise ProtocolError(f"`messages` cannot be tokenized: {type(e).__name__}: {str(e)[:120]}", "messages") from None
    if isinstance(tokens, dict):
        tokens = tokens["input_ids"]
    return [int(t) for t in tokens]
