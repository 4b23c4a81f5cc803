"""Tool calls for a model whose chat template has no tool-call format: the generic format.

The tools are described to the model in a system message, and a call is a JSON object between
text markers, the form many models already know from the Hermes and Qwen2.5 templates:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`auto` parses such blocks out of the answer (as for a template's own format, a block that does not
parse stays content); `required` and a named function are enforced by a grammar that writes exactly
one block (`grammar.tool_grammar(..., GENERIC)`); `none` describes no tools. The history is
rewritten to match: an assistant's `tool_calls` become blocks in its content, and `tool` messages
become a user turn of `<tool_response>` blocks, since such templates know no `tool` role. Adjacent
user turns are joined, for templates that insist that roles alternate.
"""

from __future__ import annotations

import json

from mtpstack.worker.protocol.output import Markers

#: The format's name where a template's own would be (`qwen3_coder`, `json_tools`, ...).
GENERIC = "generic"
TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"

INTRO = "# Tools\n\nYou may call one or more of these functions. Each is described by a JSON schema:\n<tools>\n"
OUTRO = (
    "\n</tools>\n\nTo call a function, reply with one block per call, in exactly this form:\n"
    f"{TOOL_START}\n" '{"name": <function name>, "arguments": <arguments as a JSON object>}' f"\n{TOOL_END}\n"
    "A function's result comes back in a <tool_response> block."
)


def parse_call(body: str, tools=None) -> dict:
    """One call's block body as `{"name", "arguments"}`; raises on anything else (then it is content)."""
    call = json.loads(body)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError("a call is an object with a string `name`")
    args = call.get("arguments", {})
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError("a call's `arguments` is an object")
    return {"name": call["name"], "arguments": args}


def markers(tokenizer) -> Markers:
    """The tokenizer's own reasoning markers, and the generic format's call markers and parser."""
    own = Markers.of(tokenizer)
    return Markers(own.think_start, own.think_end, TOOL_START, TOOL_END, parse_call)


def describe(tools: list[dict]) -> str:
    return INTRO + "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools) + OUTRO


def _call_block(call: dict) -> str:
    fn = call["function"]
    return f"{TOOL_START}\n{json.dumps({'name': fn['name'], 'arguments': fn['arguments']}, ensure_ascii=False)}\n{TOOL_END}"


def rewrite(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The history (already normalized) in the generic format, with the tools described first
    (`tools` None: none described, as for `tool_choice: none`)."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = "\n".join(_call_block(c) for c in m["tool_calls"])
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = f"{m['content']}\n{blocks}" if m["content"] else blocks
        elif m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        if out and m["role"] == "user" and out[-1]["role"] == "user" and set(out[-1]) == {"role", "content"} == set(m):
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{m['content']}"}
        else:
            out.append(m)
    if tools:
        text = describe(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out
