"""`POST /v1/responses`, stateless: a Responses request becomes a chat request, and the chat's
split output (reasoning, text, tool calls) becomes Responses output items and stream events.

Stateless means nothing is stored: `previous_response_id`, `conversation` and `background` are
400s naming the field, and a client carries its history in `input` (function calls and their
outputs included), as with Chat Completions; `store` is accepted and nothing is kept.

Lenient where OpenAI's API grows faster than any server: a top-level field this worker does not know
is ignored (logged once per name), not refused, so a client that adds one (Codex's
`client_metadata`) keeps working. Tools: `function` tools are served, a `namespace` tool (a named
group of function tools) is flattened into its functions, and hosted tools (`web_search`,
`file_search`, `computer_use`, ...) are dropped from what the model sees, logged once per type;
history items of hosted tools are dropped the same way.
"""

from __future__ import annotations

import logging
import time
import uuid

from mtpstack.refusals import NOT_AN_OBJECT
from mtpstack.worker.protocol.chat import (OutputSpec, ProtocolError, content_text, optional_string, reword_refusal,
                                           shown, tool_arguments, tool_list)
from mtpstack.worker.protocol.output import Markers, OutputSplitter, Piece

log = logging.getLogger("mtpstack.worker")

#: Fields that need state the worker does not keep.
STATEFUL = ("previous_response_id", "conversation", "background")
#: Fields passed through to the chat request unchanged.
PASSED = ("model", "temperature", "top_p", "stream", "seed", "stop", "chat_template_kwargs", "num_draft_tokens", "ignore_eos",
          "stream_options", "prompt_cache_key", "mtpstack_class")
#: Fields read here and translated.
TRANSLATED = ("input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "reasoning")
#: Fields accepted and not acted on, without a log line: they change nothing about the answer here.
IGNORED = ("metadata", "user", "parallel_tool_calls", "safety_identifier", "service_tier", "store", "truncation",
           "include", "max_tool_calls", "client_metadata", "prompt_cache_retention", "top_logprobs")
#: A refusal of the translated chat request names the field the client sent.
RESPONSES_PARAM = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text",
                   "reasoning_effort": "reasoning", "max_reasoning_tokens": "reasoning"}
#: Distinct names logged as ignored, at most: a client cannot fill the log by inventing fields.
MAX_NOTED = 256
_noted: set[str] = set()


def note_once(what: str, message: str) -> None:
    """Log `message` the first time `what` is seen in this process."""
    if what in _noted or len(_noted) >= MAX_NOTED:
        return
    _noted.add(what)
    log.warning("%s", message)


def drop_tools(api: str, kind: str, *, served: str) -> None:
    """Log once that tools of `kind` sent to `/v1/<api>` are not shown to the model (only `served` ones are)."""
    note_once(f"tool:{kind[:40]}", f"/v1/{api}: `{kind[:40]}` tools are dropped from what the model sees: "
                                   f"only {served} tools are served")


def responses_refusal(param: str | None, message: str) -> tuple[str | None, str]:
    """A refusal of the translated chat request, about the field the client sent: `tools[i].function.x`
    is `tools[i].x` here (Responses tools are flat), a message's field is `input`."""
    return reword_refusal(param, message, tool_field=".function.", flat_tool_field=".", messages="input",
                          renamed=RESPONSES_PARAM)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _messages(body: dict) -> list[dict]:
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ProtocolError("`instructions` must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ProtocolError("`input` must be a string or a non-empty list of items", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": content_text(item.get("content"), where, "input")})
        elif kind == "function_call":
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise ProtocolError(f"`{where}.name` must be a non-empty string: {shown(name)}", f"{where}.name")
            call = {"id": optional_string(item.get("call_id"), f"{where}.call_id"), "type": "function",
                    "function": {"name": name, "arguments": tool_arguments(item.get("arguments", "{}"), f"{where}.arguments")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not last["content"]:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": optional_string(item.get("call_id"), f"{where}.call_id"),
                             "content": output if isinstance(output, str) else content_text(output, where, "input")})
        elif kind == "reasoning":
            continue  # the family's templates drop earlier turns' reasoning anyway
        elif isinstance(kind, str) and kind.endswith(("_call", "_call_output")):
            note_once(f"input:{kind[:40]}", f"/v1/responses: `{kind[:40]}` items in `input` are dropped: "
                                            "only function tools are served")
        else:
            raise ProtocolError(f"unsupported input item: {where} (type `{str(kind)[:40]}`)", "input", "unsupported_parameter")
    return messages


def _function(t: dict) -> dict:
    return {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}}


def _tools(tools) -> list[dict] | None:
    """Function tools as chat tools; a namespace's functions flattened; hosted tools dropped (logged)."""
    if tool_list(tools) is None:
        return None
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "function":
            out.append(_function(t))
        elif kind == "namespace":
            inner = t.get("tools")
            if not isinstance(inner, list) or not all(isinstance(f, dict) and f.get("type") == "function" for f in inner):
                raise ProtocolError(f"a namespace tool must hold a list of function tools: tools[{i}].tools", f"tools[{i}].tools")
            out += [_function(f) for f in inner]
        elif isinstance(kind, str) and kind:
            drop_tools("responses", kind, served="function")
        else:
            raise ProtocolError(f"each tool needs a string `type`: tools[{i}]", f"tools[{i}]")
    return out


def namespaces(tools) -> dict[str, str]:
    """Function name -> the namespace tool that holds it, so a call can say which it belongs to."""
    out = {}
    for t in tools if isinstance(tools, list) else []:
        if isinstance(t, dict) and t.get("type") == "namespace" and isinstance(t.get("name"), str):
            for f in t.get("tools") or []:
                if isinstance(f, dict) and isinstance(f.get("name"), str):
                    out[f["name"]] = t["name"]
    return out


def _tool_choice(choice):
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise ProtocolError("`tool_choice` must be `auto`, `none`, `required` or `{\"type\": \"function\", \"name\": ...}`",
                        "tool_choice")


def _format(text):
    if text is None:
        return None
    if not isinstance(text, dict):
        raise ProtocolError(f"`text` must be an object: {shown(text)}", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ProtocolError("`text.format` must be an object", "text")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "schema"), "schema": fmt.get("schema"),
                                                       "strict": fmt.get("strict")}}
    return {"type": fmt.get("type")}


def _reasoning(reasoning, chat: dict) -> None:
    """`reasoning.effort` -> chat's `reasoning_effort`; `reasoning.max_tokens` -> `max_reasoning_tokens`;
    `summary` (and anything else) is accepted and not acted on: the reasoning is returned whole."""
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise ProtocolError(f"`reasoning` must be an object: {shown(reasoning)}", "reasoning")
    if reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if reasoning.get("max_tokens") is not None:
        chat["max_reasoning_tokens"] = reasoning["max_tokens"]


def to_chat(body) -> dict:
    """The chat request a Responses request means; refusals name the Responses field."""
    if not isinstance(body, dict):
        raise ProtocolError(NOT_AN_OBJECT, None)
    for key in STATEFUL:
        if body.get(key) not in (None, False):
            raise ProtocolError(f"this worker is stateless: `{key}` is not supported; send the history in `input`", key,
                                "unsupported_parameter")
    for key in sorted(k for k in body if k not in (*TRANSLATED, *PASSED, *STATEFUL, *IGNORED)):
        note_once(f"field:{key[:60]}", f"/v1/responses: field `{key[:60]}` is accepted and ignored")
    chat = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = _messages(body)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if (tools := _tools(body.get("tools"))) is not None:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
        if chat["tool_choice"] in ("auto", "none") and not tools:
            del chat["tool_choice"]  # every tool was hosted: nothing is left to choose from
    if (fmt := _format(body.get("text"))) is not None:
        chat["response_format"] = fmt
    _reasoning(body.get("reasoning"), chat)
    return chat


class ResponseBuilder:
    """Output items and stream events from the model's text, split as for chat."""

    def __init__(self, spec: OutputSpec | None, model: str, request: dict):
        spec = spec or OutputSpec(Markers())
        self.splitter = OutputSplitter(spec.markers, spec.reasoning, spec.tools, spec.parse_tools)
        self.id, self.created, self.model = _id("resp"), int(time.time()), model
        self.request = request
        self.namespaces = namespaces(request.get("tools"))
        self.items: list[dict] = []
        self.seq = 0
        self._open: dict | None = None  # the reasoning or message item being streamed

    def _event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq, **fields}

    def response(self, status: str, usage: dict | None = None, incomplete: str | None = None) -> dict:
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": self.items if status != "in_progress" else [], "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": self.request.get("instructions"), "metadata": self.request.get("metadata") or {},
            "parallel_tool_calls": self.request.get("parallel_tool_calls") is not False, "temperature": self.request.get("temperature"),
            "top_p": self.request.get("top_p"), "tool_choice": self.request.get("tool_choice", "auto"),
            "tools": self.request.get("tools") or [], "text": self.request.get("text") or {"format": {"type": "text"}},
            "max_output_tokens": self.request.get("max_output_tokens"), "previous_response_id": None, "store": False,
            "usage": usage,
        }

    def start(self) -> list[dict]:
        r = self.response("in_progress")
        return [self._event("response.created", response=r), self._event("response.in_progress", response=r)]

    def _close(self) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        idx = self.items.index(item)
        item["status"] = "completed"
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            return [self._event("response.reasoning_text.done", item_id=item["id"], output_index=idx, content_index=0, text=text),
                    self._event("response.output_item.done", output_index=idx, item=item)]
        part = item["content"][0]
        return [self._event("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0,
                            text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0, part=part),
                self._event("response.output_item.done", output_index=idx, item=item)]

    def _piece(self, p: Piece) -> list[dict]:
        out: list[dict] = []
        if p.kind == "tool_call":
            out += self._close()
            f = p.call["function"]
            item = {"type": "function_call", "id": _id("fc"), "call_id": p.call["id"], "name": f["name"],
                    "arguments": f["arguments"], "status": "completed"}
            if (ns := self.namespaces.get(f["name"])) is not None:
                item["namespace"] = ns
            self.items.append(item)
            idx = len(self.items) - 1
            added = dict(item, arguments="", status="in_progress")
            return out + [
                self._event("response.output_item.added", output_index=idx, item=added),
                self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=idx, delta=f["arguments"]),
                self._event("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                            arguments=f["arguments"], name=f["name"]),
                self._event("response.output_item.done", output_index=idx, item=item),
            ]
        kind = "reasoning" if p.kind == "reasoning" else "message"
        if self._open is None or self._open["type"] != kind:
            out += self._close()
            if kind == "reasoning":
                item = {"type": "reasoning", "id": _id("rs"), "summary": [], "status": "in_progress",
                        "content": [{"type": "reasoning_text", "text": ""}]}
            else:
                item = {"type": "message", "id": _id("msg"), "role": "assistant", "status": "in_progress",
                        "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
            self.items.append(item)
            self._open = item
            idx = len(self.items) - 1
            out.append(self._event("response.output_item.added", output_index=idx,
                                   item=dict(item, content=[] if kind == "message" else item["content"])))
            if kind == "message":
                out.append(self._event("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0,
                                       part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        item = self._open
        idx = self.items.index(item)
        item["content"][0]["text"] += p.text
        delta_kind = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        out.append(self._event(delta_kind, item_id=item["id"], output_index=idx, content_index=0, delta=p.text, **extra))
        return out

    def feed(self, text: str) -> list[dict]:
        return [e for p in (self.splitter.feed(text) if text else []) for e in self._piece(p)]

    def finish(self, reason: str | None, usage: dict) -> list[dict]:
        events = [e for p in self.splitter.finish() for e in self._piece(p)] + self._close()
        incomplete = "max_output_tokens" if reason == "length" else None
        final = self.response("incomplete" if incomplete else "completed", usage, incomplete)
        return events + [self._event("response.incomplete" if incomplete else "response.completed", response=final)]


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens}
