"""Answer shapes: the chat message and its deltas (content, `reasoning`, `tool_calls`) and the
two logprobs shapes (chat's `content` list, completions' parallel lists).

The reasoning field is `reasoning`: what `mlx_lm.server` returns and what vLLM returns since it
removed `reasoning_content` (vllm-project/vllm PRs 27752 and 33402), following OpenAI's guidance
for chain of thought in Chat Completions. Both names are accepted in the history.
"""

from __future__ import annotations

from mtpstack.worker.protocol.chat import OutputSpec
from mtpstack.worker.protocol.hooks import TokenLogprob
from mtpstack.worker.protocol.output import Markers, OutputSplitter, Piece, assemble

REASONING_FIELD = "reasoning"


class ChatText:
    """The model's text, split as it arrives; the same split whether streamed or not."""

    def __init__(self, spec: OutputSpec | None):
        spec = spec or OutputSpec(Markers())
        self.splitter = OutputSplitter(spec.markers, spec.reasoning, spec.tools, spec.parse_tools)
        self.pieces: list[Piece] = []

    def feed(self, text: str) -> list[dict]:
        new = self.splitter.feed(text) if text else []
        self.pieces += new
        return [_delta(p) for p in new]

    def finish(self) -> list[dict]:
        new = self.splitter.finish()
        self.pieces += new
        return [_delta(p) for p in new]

    def message(self) -> dict:
        fields = assemble(self.pieces)
        msg = {"role": "assistant", "content": fields["content"] or (None if fields["tool_calls"] else "")}
        if fields["reasoning"]:
            msg[REASONING_FIELD] = fields["reasoning"]
        if fields["tool_calls"]:
            msg["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in fields["tool_calls"]]
        return msg

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.splitter.calls else reason


def _delta(p: Piece) -> dict:
    if p.kind == "tool_call":
        return {"tool_calls": [p.call]}
    return {REASONING_FIELD if p.kind == "reasoning" else "content": p.text}


def _token_text(tokenizer, tok: int) -> str:
    return tokenizer.decode([tok])


def chat_logprobs(entries: list[TokenLogprob], tokenizer) -> list[dict]:
    def one(tok, lp):
        text = _token_text(tokenizer, tok)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    return [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries]


def completion_logprobs(entries: list[TokenLogprob], tokenizer, offset: int) -> dict:
    """`offset`: characters of text already answered before these tokens."""
    tokens, offsets = [], []
    for e in entries:
        text = _token_text(tokenizer, e.token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_token_text(tokenizer, t): v for t, v in e.top} for e in entries],
        "text_offset": offsets,
    }
