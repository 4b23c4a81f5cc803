"""The answer of `POST /v1/messages` (Anthropic's Messages API): the chat's split output (reasoning,
text, tool calls) as content blocks and stream events, its stop reason and its usage. The request's
translation is `mtpstack.worker.protocol.messages`.

A thinking block's `signature` carries its own text (`messages.signature_of`): with `display:
omitted` a client sends the block back with empty `thinking`, and the history is still rendered as
the model wrote it.
"""

from __future__ import annotations

import json
import uuid

from mtpstack.worker.protocol.chat import OutputSpec
from mtpstack.worker.protocol.messages import answer_options, signature_of
from mtpstack.worker.protocol.output import Markers, OutputSplitter, Piece

#: Anthropic's stop reasons for the engine's finish reasons.
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict:
    """Anthropic's usage: `input_tokens` are the prompt's tokens not read from the prefix cache, so
    the three input counts add up to the prompt, as Anthropic's do."""
    return {"input_tokens": prompt_tokens - cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached_tokens, "output_tokens": output_tokens}


class MessageBuilder:
    """Content blocks and stream events from the model's text, split as for chat."""

    def __init__(self, spec: OutputSpec | None, model: str, display: str = "summarized", single_call: bool = False,
                 stops: tuple[str, ...] = ()):
        spec = spec or OutputSpec(Markers())
        self.splitter = OutputSplitter(spec.markers, spec.reasoning, spec.tools, spec.parse_tools)
        self.id, self.model = f"msg_{uuid.uuid4().hex[:24]}", model
        self.display, self.single_call, self.stops = display, single_call, stops
        self.blocks: list[dict] = []
        self.calls = 0
        self._open: dict | None = None  # the text or thinking block being streamed
        self._reasoning = ""  # the open thinking block's text, also when it is not shown

    @classmethod
    def for_request(cls, spec: OutputSpec | None, model: str, body: dict) -> "MessageBuilder":
        return cls(spec, model, **answer_options(body))

    def start(self, usage: dict) -> list[dict]:
        return [{"type": "message_start", "message": self._message([], None, None, usage)}]

    def _message(self, content: list, stop_reason, stop_sequence, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    def _close(self) -> list[dict]:
        block, self._open = self._open, None
        if block is None:
            return []
        idx = self.blocks.index(block)
        out = []
        if block["type"] == "thinking":
            block["signature"] = signature_of(self._reasoning)
            out.append({"type": "content_block_delta", "index": idx,
                        "delta": {"type": "signature_delta", "signature": block["signature"]}})
        return out + [{"type": "content_block_stop", "index": idx}]

    def _piece(self, p: Piece) -> list[dict]:
        if p.kind == "tool_call":
            if self.single_call and self.calls:
                return []  # `disable_parallel_tool_use`: the first call only
            self.calls += 1
            out = self._close()
            f = p.call["function"]
            try:
                arguments = json.loads(f["arguments"])
            except ValueError:
                arguments = {}
            block = {"type": "tool_use", "id": new_tool_use_id(), "name": f["name"],
                     "input": arguments if isinstance(arguments, dict) else {}}
            self.blocks.append(block)
            idx = len(self.blocks) - 1
            return out + [
                {"type": "content_block_start", "index": idx, "content_block": dict(block, input={})},
                {"type": "content_block_delta", "index": idx,
                 "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}},
                {"type": "content_block_stop", "index": idx},
            ]
        kind = "thinking" if p.kind == "reasoning" else "text"
        out = []
        if self._open is None or self._open["type"] != kind:
            out += self._close()
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""}
            self.blocks.append(block)
            self._open, self._reasoning = block, ""
            out.append({"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)})
        idx = len(self.blocks) - 1
        if kind == "thinking":
            self._reasoning += p.text
            if self.display == "omitted":
                return out
            self._open["thinking"] += p.text
            return out + [{"type": "content_block_delta", "index": idx, "delta": {"type": "thinking_delta", "thinking": p.text}}]
        self._open["text"] += p.text
        return out + [{"type": "content_block_delta", "index": idx, "delta": {"type": "text_delta", "text": p.text}}]

    def feed(self, text: str) -> list[dict]:
        return [e for p in (self.splitter.feed(text) if text else []) for e in self._piece(p)]

    def stop_reason(self, reason: str | None, stop_sequence: str | None) -> str:
        if self.calls:
            return "tool_use"
        if stop_sequence is not None:
            return "stop_sequence"
        return STOP_REASONS.get(reason, "end_turn")

    def finish(self, reason: str | None, usage: dict, stop_sequence: str | None = None) -> list[dict]:
        """The last events; `reason` is the engine's finish reason, `stop_sequence` the one it stopped at."""
        events = [e for p in self.splitter.finish() for e in self._piece(p)] + self._close()
        stop = self.stop_reason(reason, stop_sequence)
        return events + [
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": stop_sequence if stop == "stop_sequence" else None},
             "usage": usage},
            {"type": "message_stop"},
        ]

    def message(self, reason: str | None, usage: dict, stop_sequence: str | None = None) -> dict:
        """The whole message, once `finish` has run."""
        stop = self.stop_reason(reason, stop_sequence)
        return self._message(self.blocks, stop, stop_sequence if stop == "stop_sequence" else None, usage)


def matched_stop(stops: tuple[str, ...], full_text: str, kept: str) -> str | None:
    """Which of `stops` ended the output: the engine cuts its text where a stop string begins, so the
    decoded tokens continue with it past the kept text; None when it ended otherwise."""
    return next((s for s in stops if s and full_text.startswith(s, len(kept))), None)
