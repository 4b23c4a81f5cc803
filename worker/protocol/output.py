"""The model's output text split into reasoning, content and tool calls, as it streams.

A model of the Qwen3.5 family writes `reasoning</think>content` (its chat template opens
`<think>` inside the prompt) and calls tools with `<tool_call>...</tool_call>` blocks. The
markers and the parser of a call's body come from mlx-lm's tokenizer wrapper (`think_start`,
`think_end`, `tool_call_start`, `tool_call_end`, `tool_parser`), so every format it knows
(`qwen3_coder` XML, `json_tools`, ...) is handled the same way.

Guarantees: no marker and no well-formed tool-call block ever reaches `content`; a marker split
across chunks is held back until it can be told apart; the pieces streamed reassemble to the
answer `finish()` completes (the same split as one `feed` of the whole text). A block that does
not parse (a call cut by `max_tokens`) is returned as content rather than dropped, so the client
sees what the model wrote.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Markers:
    think_start: str | None = None
    think_end: str | None = None
    tool_start: str | None = None
    tool_end: str | None = None
    tool_parser: Callable | None = None

    @classmethod
    def of(cls, tokenizer) -> "Markers":
        """The markers mlx-lm's `TokenizerWrapper` inferred from the chat template and vocabulary."""
        thinking = getattr(tokenizer, "has_thinking", False)
        tools = getattr(tokenizer, "has_tool_calling", False)
        return cls(
            think_start=tokenizer.think_start if thinking else None,
            think_end=tokenizer.think_end if thinking else None,
            tool_start=tokenizer.tool_call_start if tools else None,
            tool_end=tokenizer.tool_call_end if tools else None,
            tool_parser=tokenizer.tool_parser if tools else None,
        )


@dataclass
class Piece:
    """One delta: `kind` is `reasoning`, `content` or `tool_call` (then `call` is set)."""

    kind: str
    text: str = ""
    call: dict | None = None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call(parsed: dict, index: int) -> dict:
    """A parsed call in the OpenAI shape; `arguments` is a JSON string, as clients expect."""
    args = parsed.get("arguments", {})
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"index": index, "id": new_call_id(), "type": "function",
            "function": {"name": str(parsed.get("name", "")), "arguments": args}}


@dataclass
class OutputSplitter:
    markers: Markers
    reasoning: bool = False  # the prompt ends inside a think block
    tools: list | None = None  # the request's tools, for the parser's type conversions
    parse_tools: bool = True  # False for `tool_choice: none`: calls stay content
    calls: list[dict] = field(default_factory=list)
    _buf: str = ""
    _state: str = ""
    _pending_space: str = ""  # content's trailing whitespace, held until something visible follows
    _after_think: bool = False

    def __post_init__(self):
        self._state = "reasoning" if self.reasoning and self.markers.think_end else "content"

    def _markers_here(self) -> list[tuple[str, str]]:
        m = self.markers
        if self._state == "reasoning":
            return [(m.think_end, "content")]
        if self._state == "tool":
            return [(m.tool_end, "content")]
        out = [(m.think_start, "reasoning")]
        if self.parse_tools and m.tool_parser is not None:
            out.append((m.tool_start, "tool"))
        return [(s, nxt) for s, nxt in out if s]

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while True:
            found = [(self._buf.find(s), s, nxt) for s, nxt in self._markers_here()]
            found = [f for f in found if f[0] >= 0]
            if not found:
                break
            at, marker, nxt = min(found)
            self._emit(self._buf[:at], out, final=True)
            self._buf = self._buf[at + len(marker):]
            self._after_think = self._state == "reasoning" and nxt == "content"
            self._state = nxt
        if self._state != "tool":
            keep = max((_partial_suffix(self._buf, s) for s, _ in self._markers_here()), default=0)
            self._emit(self._buf[: len(self._buf) - keep], out, final=False)
            self._buf = self._buf[len(self._buf) - keep:]
        return out

    def finish(self) -> list[Piece]:
        """Whatever is still held: a partial marker is text after all; an unclosed call is tried."""
        out: list[Piece] = []
        rest, self._buf = self._buf, ""
        if self._state == "tool":
            self._emit(rest, out, final=True, closed=False)
        else:
            self._emit(rest, out, final=True)
        if self._pending_space and not self.calls:
            self._append(self._pending_space, out)
        self._pending_space = ""
        return out

    def _emit(self, text: str, out: list[Piece], final: bool, closed: bool = True) -> None:
        if self._state == "tool":
            if not final:
                return
            parsed = self._parse(text)
            if parsed is None:
                raw = self.markers.tool_start + text + (self.markers.tool_end if closed else "")
                self._content(raw, out)
            else:
                self._pending_space = ""
                for p in parsed:
                    call = tool_call(p, len(self.calls))
                    self.calls.append(call)
                    out.append(Piece("tool_call", call=call))
            return
        if not text:
            return
        if self._state == "reasoning":
            out.append(Piece("reasoning", text))
            return
        if self._after_think:
            text = text.lstrip("\n")
            if not text:
                return
            self._after_think = False
        self._content(text, out)

    def _content(self, text: str, out: list[Piece]) -> None:
        """Trailing whitespace waits for what follows: before a call it is dropped, else kept."""
        visible = text.rstrip()
        if not visible:
            self._pending_space += text
            return
        text, self._pending_space = self._pending_space + visible, text[len(visible):]
        self._append(text, out)

    def _append(self, text: str, out: list[Piece]) -> None:
        if out and out[-1].kind == "content":
            out[-1].text += text
        else:
            out.append(Piece("content", text))

    def _parse(self, body: str) -> list[dict] | None:
        try:
            parsed = self.markers.tool_parser(body, self.tools)
        except Exception:  # a third-party parser on model text: anything it refuses is not a call
            return None
        parsed = parsed if isinstance(parsed, list) else [parsed]
        if not parsed or not all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in parsed):
            return None
        return parsed


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def assemble(pieces: list[Piece]) -> dict:
    """Pieces joined into a message's fields: `content`, `reasoning` and `tool_calls`."""
    content = "".join(p.text for p in pieces if p.kind == "content")
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    calls = [p.call for p in pieces if p.kind == "tool_call"]
    return {"content": content, "reasoning": reasoning, "tool_calls": calls}
