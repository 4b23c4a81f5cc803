"""Server-sent events: one framing for every streaming answer of the worker."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import mtpstack.worker
from mtpstack.worker.sse import DONE, frame

WORKER = Path(mtpstack.worker.__file__).parent


def test_an_event_is_one_data_line_of_json_then_a_blank_line():
    payload = {"id": "chatcmpl-1", "choices": [{"delta": {"content": "é\n"}}]}
    assert frame(payload) == b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_a_named_event_puts_its_name_on_an_event_line_before_the_data():
    payload = {"type": "response.created", "sequence_number": 0}
    assert frame(payload, event=payload["type"]) == b"event: response.created\ndata: " + json.dumps(payload).encode() + b"\n\n"


def test_a_stream_ends_with_the_done_marker():
    assert DONE == b"data: [DONE]\n\n"


def test_no_other_worker_module_frames_an_event_itself():
    # A `data:` written anywhere else would be a second framing that can drift from this one.
    framing = []
    for path in WORKER.rglob("*.py"):
        if path.name == "sse.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
                if text.lstrip().startswith(("data: ", "event: ")):
                    framing.append(f"{path.relative_to(WORKER)}:{node.lineno}")
    assert framing == []
