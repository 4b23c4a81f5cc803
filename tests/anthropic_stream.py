"""Anthropic streaming events replayed the way the official SDKs accumulate them (for the tests)."""

from __future__ import annotations

import json

#: delta type -> the content block field it extends.
DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}


def replay(events: list[dict]) -> dict:
    """The events folded into one message: blocks opened in order, deltas appended, a tool call's
    `input_json_delta`s parsed into its `input` when the block stops."""
    msg = None
    for e in events:
        if e["type"] == "message_start":
            msg = json.loads(json.dumps(e["message"]))
        elif e["type"] == "content_block_start":
            assert e["index"] == len(msg["content"])
            msg["content"].append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta":
            block, d = msg["content"][e["index"]], e["delta"]
            if d["type"] == "input_json_delta":
                block["_json"] = block.get("_json", "") + d["partial_json"]
            else:
                key = DELTA_FIELDS[d["type"]]
                block[key] = block.get(key, "") + d[key]
        elif e["type"] == "content_block_stop":
            block = msg["content"][e["index"]]
            if "_json" in block:
                block["input"] = json.loads(block.pop("_json"))
        elif e["type"] == "message_delta":
            msg.update(e["delta"])
            msg["usage"].update(e["usage"])
    return msg
