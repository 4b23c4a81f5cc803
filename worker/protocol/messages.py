"""`POST /v1/messages`, Anthropic's Messages API: a Messages request becomes a chat request (here),
and the chat's split output (reasoning, text, tool calls) becomes content blocks and stream events
(`mtpstack.worker.protocol.messages_answer`).

What Claude Code 2.1 sends is the reference (`../shared/notes/anthropic-clients.md`): `system` as text
blocks, a message of role `system` after the first user turn, `tool_result` blocks with string or
block content, `thinking` blocks in the history, `max_tokens: 32000` (a cap: the worker clamps it to
the room left in the context), `thinking: {type: adaptive, display: omitted}`, `output_config.effort`,
`context_management`, `metadata` and `cache_control` everywhere.

Lenient where the API grows faster than any server, as `/v1/responses` is: a top-level field this
worker does not know is ignored (logged once per name); server tools (`web_search_20250305`,
`bash_20250124`, ... : a `type` other than `custom`) are dropped from what the model sees and
history blocks it cannot read (images, server tool results) are replaced by a short note or dropped,
logged once per kind. A message of role `system` inside `messages` is read where it stands: leading
ones join `system`; later ones become user text joined to the neighbouring user turn, since chat
templates take one system message, at the start (Qwen3.5's raises otherwise), and a system message
that moved to the start would change the prompt's beginning, and so the prefix cache's reuse, each
time it changes.

Claude Code's first system block, its billing line, is read in a normalised form (`billing_line`): the
one change made to what the client sent, so that the fields it changes per request do not break the
prompt's prefix.

A thinking block's `signature` carries its own text (compressed): with `display: omitted` a client
sends the block back with empty `thinking`, and the history is still rendered as the model wrote it.
"""

from __future__ import annotations

import base64
import zlib

from mtpstack.worker.protocol.chat import ProtocolError, optional_string, reword_refusal, shown, tool_arguments, tool_list
from mtpstack.worker.protocol.responses import drop_tools, note_once

#: Fields passed through to the chat request unchanged.
PASSED = ("model", "temperature", "top_p", "stream", "num_draft_tokens", "mtpstack_class", "chat_template_kwargs",
          "ignore_eos")
#: Fields read here and translated.
TRANSLATED = ("system", "messages", "tools", "tool_choice", "max_tokens", "stop_sequences", "thinking", "output_config",
              "top_k")
#: Fields accepted and not acted on, without a log line: they change nothing about the answer here
#: (`metadata.user_id` keys the proxy's routing; `cache_control` is the prefix cache's job, which
#: needs no marks; `context_management` edits thinking the templates already drop).
IGNORED = ("metadata", "cache_control", "context_management", "service_tier", "container", "betas", "mcp_servers",
           "inference_geo", "speed", "diagnostics", "user_profile_id", "workspace_id")
#: `output_config.effort` -> chat's `reasoning_effort` (Anthropic's `max` is OpenAI's `xhigh`).
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "xhigh"}
#: A refusal of the translated chat request names the field the client sent.
MESSAGES_PARAM = {"stop": "stop_sequences", "reasoning_effort": "thinking", "max_reasoning_tokens": "thinking",
                  "response_format": "output_config"}
#: What the model reads in place of a block it cannot see (this worker serves text models).
UNREADABLE = "[{kind} omitted: this model reads text only]"
#: A signature this worker minted: its reasoning text, compressed (`signature_of`).
SIGNATURE_PREFIX = "mtp1."
#: The longest reasoning a signature is read back into: a client cannot make the worker inflate more.
MAX_SIGNED_BYTES = 1 << 20


def messages_refusal(param: str | None, message: str) -> tuple[str | None, str]:
    """A refusal of the translated chat request, about the field the client sent: a chat message's
    index is not the client's (tool results become messages of their own), so it names `messages`;
    `tools[i].function.parameters` is `tools[i].input_schema` here."""
    return reword_refusal(param, message, tool_field=".function.parameters", flat_tool_field=".input_schema",
                          messages="messages", renamed=MESSAGES_PARAM)


def signature_of(reasoning: str) -> str:
    """The signature of a thinking block: its text, so the history renders as written even when the
    client was sent the block without its text (`display: omitted`)."""
    packed = base64.urlsafe_b64encode(zlib.compress(reasoning.encode("utf-8", "surrogatepass"), 6)).decode()
    return SIGNATURE_PREFIX + packed


def reasoning_of(signature) -> str:
    """The text a signature of `signature_of` carries; "" for any other (another server's, or garbage)."""
    if not isinstance(signature, str) or not signature.startswith(SIGNATURE_PREFIX):
        return ""
    try:
        packed = base64.urlsafe_b64decode(signature[len(SIGNATURE_PREFIX):].encode("ascii"))
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, MAX_SIGNED_BYTES)
        if inflate.unconsumed_tail or not inflate.eof:
            return ""
        return raw.decode("utf-8")
    except (ValueError, zlib.error, UnicodeError):
        return ""


def _blocks(content, where: str) -> list[dict]:
    """A message's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ProtocolError(f"`{where}.content` must be a string or a list of content blocks: {shown(content)}", "messages")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ProtocolError(f"each content block needs a string `type`: {where}.content[{j}]", "messages")
    return content


def _text(block: dict, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise ProtocolError(f"`{where}.text` must be a string: {shown(text)}", "messages")
    return text


def _readable(block: dict, where: str) -> str | None:
    """The text a user-side block gives the model: its text, a text document's data, a note in
    place of an image or a binary document; None for a block kind that says nothing to a model."""
    kind = block["type"]
    if kind == "text":
        return _text(block, where)
    if kind == "document":
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
            return source["data"]
    if kind in ("image", "document"):
        note_once(f"block:{kind}", f"/v1/messages: `{kind}` blocks are replaced by a note: this model reads text only")
        return UNREADABLE.format(kind=kind)
    note_once(f"block:{kind[:40]}", f"/v1/messages: `{kind[:40]}` blocks are dropped from what the model sees")
    return None


def _joined(parts: list[str]) -> str:
    return "\n\n".join(p for p in parts if p)


def _text_only(content, where: str) -> str:
    return _joined([t for j, b in enumerate(_blocks(content, where)) if (t := _readable(b, f"{where}.content[{j}]")) is not None])


def _tool_result(block: dict, where: str) -> dict:
    use_id = optional_string(block.get("tool_use_id"), f"{where}.tool_use_id")
    content = block.get("content")
    text = "" if content is None else content if isinstance(content, str) else _text_only(content, where)
    error = block.get("is_error")
    if error is not None and not isinstance(error, bool):
        raise ProtocolError(f"`{where}.is_error` must be a boolean: {shown(error)}", "messages")
    msg = {"role": "tool", "content": f"Error: {text}" if error else text}
    if use_id is not None:
        msg["tool_call_id"] = use_id
    return msg


def _user(content, where: str) -> list[dict]:
    """A user turn: its tool results as `tool` messages first (they answer the calls just before),
    then its text as one user message."""
    results, texts = [], []
    for j, block in enumerate(_blocks(content, where)):
        here = f"{where}.content[{j}]"
        if block["type"] == "tool_result":
            results.append(_tool_result(block, here))
        elif (text := _readable(block, here)) is not None:
            texts.append(text)
    return results + ([{"role": "user", "content": _joined(texts)}] if texts or not results else [])


def _assistant(content, where: str) -> dict:
    texts, calls, reasoning = [], [], []
    for j, block in enumerate(_blocks(content, where)):
        here, kind = f"{where}.content[{j}]", block["type"]
        if kind == "text":
            texts.append(_text(block, here))
        elif kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str) or not name:
                raise ProtocolError(f"`{here}.name` must be a non-empty string: {shown(name)}", "messages")
            call = {"type": "function", "function": {"name": name, "arguments": tool_arguments(block.get("input", {}), f"{here}.input")}}
            if (use_id := optional_string(block.get("id"), f"{here}.id")) is not None:
                call["id"] = use_id
            calls.append(call)
        elif kind == "thinking":
            text = block.get("thinking")
            if text is not None and not isinstance(text, str):
                raise ProtocolError(f"`{here}.thinking` must be a string: {shown(text)}", "messages")
            reasoning.append(text or reasoning_of(block.get("signature")))
        elif kind != "redacted_thinking":  # another server's encrypted reasoning: nothing to render
            note_once(f"block:{kind[:40]}", f"/v1/messages: `{kind[:40]}` blocks are dropped from what the model sees")
    msg = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if any(reasoning):
        msg["reasoning_content"] = _joined(reasoning)
    return msg


#: How Claude Code's first system block starts: a line of accounting metadata for Anthropic (`key=value;`
#: fields), not an instruction (`billing_line`).
BILLING_PREFIX = "x-anthropic-billing-header:"
#: The fields of that line kept in what the model reads: the ones that stay the same through a
#: conversation (its version and entry point; whether it is a subagent's, a gateway's, a project's).
#: Every other field is dropped: in Claude Code's first-party mode (a base URL it takes for Anthropic's)
#: the line gains per-request ones (`cch=` a hash of the body, `cc_prompt_id=`, `cc_turn_origin=`,
#: `cc_prompt_index=`, `cc_turn_index=`, `cc_prev_req=`, `cc_prev_msg=`, ...), which would change the
#: prompt's first tokens on every request and so leave nothing of it to reuse from the prefix cache.
BILLING_KEPT = ("cc_version", "cc_entrypoint", "cc_workload", "cc_is_subagent", "cc_gateway", "cc_project",
                "cc_project_src", "cc_dispatch_entrypoint")


def billing_line(text: str) -> str:
    """Claude Code's billing line in its normalised form: `x-anthropic-billing-header:` and the fields of
    `BILLING_KEPT`, in the order sent, each as ` key=value;`. The line of its default mode (only
    `cc_version` and `cc_entrypoint`) is left as it is; any other text is returned unchanged."""
    if not text.startswith(BILLING_PREFIX) or "\n" in text:
        return text
    fields = [f.strip() for f in text[len(BILLING_PREFIX):].split(";")]
    kept = [f for f in fields if f and f.split("=", 1)[0] in BILLING_KEPT]
    return BILLING_PREFIX + "".join(f" {f};" for f in kept)


def _system(system) -> list[str]:
    if system is None:
        return []
    if isinstance(system, str):
        return [system]
    if not isinstance(system, list):
        raise ProtocolError(f"`system` must be a string or a list of text blocks: {shown(system)}", "system")
    texts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise ProtocolError(f"`system` blocks must be text blocks with a string `text`: system[{j}]", "system")
        texts.append(billing_line(block["text"]) if j == 0 else block["text"])
    return texts


def _messages(body: dict) -> list[dict]:
    items = body.get("messages")
    if not isinstance(items, list) or not items:
        raise ProtocolError("`messages` must be a non-empty list", "messages")
    lead = _system(body.get("system"))
    out: list[dict] = []
    for i, m in enumerate(items):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "system":
            text = _text_only(m.get("content"), where)
            if out:
                out.append({"role": "user", "content": text})
            else:
                lead.append(text)
        elif role == "user":
            out += _user(m.get("content"), where)
        elif role == "assistant":
            out.append(_assistant(m.get("content"), where))
        else:
            raise ProtocolError(f"`{where}.role` must be `user`, `assistant` or `system`: {shown(role)}", "messages")
    joined: list[dict] = [{"role": "system", "content": _joined(lead)}] if lead else []
    for m in out:
        last = joined[-1] if joined else None
        if last is not None and m["role"] == last["role"] == "user":
            last["content"] = _joined([last["content"], m["content"]])
        else:
            joined.append(m)
    return joined


def _tools(tools) -> list[dict] | None:
    """Custom tools as chat function tools; server tools dropped (logged)."""
    if tool_list(tools) is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise ProtocolError(f"each tool must be an object: tools[{i}]", f"tools[{i}]")
        kind = t.get("type")
        if kind not in (None, "custom"):
            if not isinstance(kind, str):
                raise ProtocolError(f"`tools[{i}].type` must be a string: {shown(kind)}", f"tools[{i}].type")
            drop_tools("messages", kind, served="custom")
            continue
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"`tools[{i}].name` must be a non-empty string: {shown(name)}", f"tools[{i}].name")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise ProtocolError(f"`tools[{i}].input_schema` must be a JSON schema object: {shown(schema)}",
                                f"tools[{i}].input_schema")
        fn = {"name": name, "parameters": schema}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice) -> tuple[object, bool]:
    """Chat's `tool_choice`, and whether at most one call may be made (`disable_parallel_tool_use`)."""
    if not isinstance(choice, dict):
        raise ProtocolError("`tool_choice` must be an object: `{\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}`", "tool_choice")
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise ProtocolError(f"`tool_choice.disable_parallel_tool_use` must be a boolean: {shown(single)}", "tool_choice")
    kind = choice.get("type")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError("`tool_choice` of type `tool` needs the tool's `name`", "tool_choice")
        return {"type": "function", "function": {"name": name}}, bool(single)
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind) if isinstance(kind, str) else None
    if mapped is None:
        raise ProtocolError(f"`tool_choice.type` must be `auto`, `any`, `tool` or `none`: {shown(kind)}", "tool_choice")
    return mapped, bool(single)


def _thinking(body: dict, chat: dict) -> str:
    """`thinking` and `output_config.effort` onto the template's thinking switch and its budget, as
    `reasoning_effort` and `max_reasoning_tokens` are; returns how thinking is displayed.

    `enabled` turns thinking on (with `budget_tokens` as the budget), `disabled` off; `adaptive` lets
    the model decide, which for an open model is its template's own default (Qwen3.5's thinks; the
    shipped demo's does not: turned on, the toy never closes its block). `output_config.effort`
    alone turns it on or off as `reasoning_effort` does; beside `thinking`, `thinking` decides."""
    thinking = body.get("thinking")
    display = "summarized"
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive", "disabled"):
            raise ProtocolError("`thinking` must be `{\"type\": \"enabled\" | \"adaptive\" | \"disabled\", ...}`", "thinking")
        if thinking["type"] != "adaptive":
            chat["reasoning_effort"] = "none" if thinking["type"] == "disabled" else "high"
        if thinking["type"] == "enabled":
            budget = thinking.get("budget_tokens")
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
                raise ProtocolError(f"`thinking.budget_tokens` must be a non-negative integer: {shown(budget)}", "thinking")
            chat["max_reasoning_tokens"] = budget
        shown_as = thinking.get("display")
        if shown_as is not None:
            # Any display but `omitted` shows the reasoning: Claude Code asks `updates` with `--verbose`,
            # and Anthropic adds modes faster than any server.
            if not isinstance(shown_as, str):
                raise ProtocolError(f"`thinking.display` must be a string: {shown(shown_as)}", "thinking")
            display = "omitted" if shown_as == "omitted" else "summarized"
    config = body.get("output_config")
    if config is not None:
        if not isinstance(config, dict):
            raise ProtocolError(f"`output_config` must be an object: {shown(config)}", "output_config")
        effort = config.get("effort")
        if effort is not None:
            if effort not in EFFORTS:
                raise ProtocolError(f"`output_config.effort` must be one of {', '.join(EFFORTS)}: {shown(effort)}",
                                    "output_config")
            if thinking is None:  # `thinking`, when sent, decides on or off
                chat["reasoning_effort"] = EFFORTS[effort]
        fmt = config.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
                raise ProtocolError("`output_config.format` must be `{\"type\": \"json_schema\", \"schema\": {...}}`",
                                    "output_config")
            chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    return display


def to_chat(body) -> dict:
    """The chat request a Messages request means; refusals name the Messages field."""
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object", None)
    for key in sorted(k for k in body if k not in (*TRANSLATED, *PASSED, *IGNORED)):
        note_once(f"messages-field:{key[:60]}", f"/v1/messages: field `{key[:60]}` is accepted and ignored")
    chat = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = _messages(body)
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ProtocolError("`stop_sequences` must be a list of strings", "stop_sequences")
        chat["stop"] = stops
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ProtocolError(f"`top_k` must be a non-negative integer: {shown(top_k)}", "top_k")
    tools = _tools(body.get("tools"))
    if tools is not None:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"], _ = _tool_choice(body["tool_choice"])
        if chat["tool_choice"] in ("auto", "none") and not tools:
            del chat["tool_choice"]  # every tool was a server tool: nothing is left to choose from
    _thinking(body, chat)
    return chat


def answer_options(body: dict) -> dict:
    """How a Messages request wants its answer written (`messages_answer.MessageBuilder`'s options), from a body
    `to_chat` has checked: thinking's display, at most one call, the stop sequences to name."""
    choice = body.get("tool_choice")
    return {"display": _thinking(body, {}), "single_call": _tool_choice(choice)[1] if choice is not None else False,
            "stops": tuple(body.get("stop_sequences") or ())}
