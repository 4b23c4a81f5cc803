"""A request's workload class, for the depth per class (`--draft-depth-map`).

The class is the client's when it names one (body field `mtpstack_class`, else
header `X-Mtpstack-Class`); otherwise a cheap look at the prompt text decides
between `code` and `prose`. It reads characters only, never tokens, and costs
one pass over the prompt.
"""

from __future__ import annotations

import re

from mtpstack.validator import DEPTH_CLASS_PATTERN

#: The body field and the header a client names its class in.
CLASS_FIELD = "mtpstack_class"
CLASS_HEADER = "X-Mtpstack-Class"
#: A class name a request may give: the shape the config allows for `depthByClass` keys.
CLASS_PATTERN = re.compile(DEPTH_CLASS_PATTERN)
#: The classes the classifier itself gives.
CODE, PROSE = "code", "prose"

#: Line starts that mark source code in most languages the fleet sees.
_CODE_LINE = re.compile(
    r"^\s*(def |class |import |from \S+ import |#include|function |const |let |var |fn |pub |package |func "
    r"|public |private |return\b|if \(|for \(|while \(|SELECT |@\w+)",
    re.MULTILINE,
)
#: Lines ending as statements or blocks do in C-like languages.
_CODE_END = re.compile(r"[;{}]\s*$", re.MULTILINE)


#: A request for code names a language or a program part ("Write a Python function ...").
_ASKS_FOR_CODE = re.compile(
    r"\b(python|javascript|typescript|rust|golang|java|kotlin|swift|haskell|ruby|php|c\+\+|c#|bash|shell script"
    r"|sql|regex|regular expression|json schema|function|script|unit tests?|class|method|implement|refactor"
    r"|compile|snippet|source code)\b|`[A-Za-z_][\w.]*\(",
    re.IGNORECASE,
)


def classify_text(text: str) -> str:
    """`code` for a fenced block, enough code-shaped lines or a request naming a language or a program
    part, else `prose`."""
    if "```" in text or _ASKS_FOR_CODE.search(text):
        return CODE
    lines = max(text.count("\n") + 1, 1)
    marked = len(_CODE_LINE.findall(text)) + len(_CODE_END.findall(text))
    # Two marked lines, or a fifth of the lines: one `return` in a story stays prose.
    return CODE if marked >= 2 and marked * 5 >= lines else PROSE


def prompt_text(body: dict) -> str:
    """The text a request's prompt is made of: message contents (text parts too), or the `prompt` string."""
    parts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        parts.append(prompt)
    return "\n".join(parts)


def classify_request(body: dict) -> str:
    """`code` when the request offers tools or its prompt looks like code, else `prose`."""
    if body.get("tools") or body.get("response_format", {}) not in ({}, None, {"type": "text"}):
        return CODE
    return classify_text(prompt_text(body))
