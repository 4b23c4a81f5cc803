"""The Qwen3.5 family's chat format for the demo tokenizer: its markers and a chat template.

One owner for the shipped demo (`devkit.demo.extend`) and the agent-API test pair
(`devkit.demo.agent`). The demo tokenizer's own ids stay as they are (a trained model depends on
them); the family's markers (`<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`,
`</tool_response>`) are added after them as special tokens. The template renders tools into the
system prompt, assistant `tool_calls` as `<tool_call>` / `<function=NAME>` / `<parameter=P>` blocks
(the `qwen3_coder` format), `tool` messages as `<tool_response>` blocks in a user turn, earlier
reasoning as a `<think>` block, and ends the generation prompt with the thinking switch. mlx-lm's
tokenizer wrapper infers from it the `qwen3_coder` tool parser and the `<think>` markers, as it
does for the real models.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from devkit.demo.bpe import ENDOFTEXT, IM_END, IM_START

MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

_BODY = (
    "{%- macro text(c) %}{%- if c is string %}{{- c }}{%- elif c %}"
    "{%- for p in c %}{{- p.text }}{%- endfor %}{%- endif %}{%- endmacro %}"
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- text(messages[0].content) + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:"
    "\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n"
    "</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<|im_start|>user\\n' + text(message.content) + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- text(message.content) }}"
    "{%- for tc in message.tool_calls or [] %}{%- set f = tc.function %}"
    "{{- '\\n<tool_call>\\n<function=' + f.name + '>\\n' }}"
    "{%- for k, v in f.arguments.items() %}{{- '<parameter=' + k + '>\\n' }}"
    "{%- if v is string %}{{- v }}{%- else %}{{- v | tojson }}{%- endif %}{{- '\\n</parameter>\\n' }}{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
)
_OPEN, _CLOSED = "{{- '<think>\\n' }}", "{{- '<think>\\n\\n</think>\\n\\n' }}"


def chat_template(*, thinking_by_default: bool) -> str:
    """The family's chat format, condensed to what the API exercises.

    `thinking_by_default`: the generation prompt opens `<think>` unless `enable_thinking` is false
    (the real models' templates); otherwise it writes an empty, closed block unless `enable_thinking`
    is true (the shipped demo: a toy whose short answers often stay in the block, so plain chat answers).
    """
    if thinking_by_default:
        switch = "{%- if enable_thinking is defined and enable_thinking is false %}" + _CLOSED + "{%- else %}" + _OPEN
    else:
        switch = "{%- if enable_thinking is defined and enable_thinking %}" + _OPEN + "{%- else %}" + _CLOSED
    return _BODY + switch + "{%- endif %}{%- endif %}"


def write_family_tokenizer(source: Path, out_dir: Path, *, context: int, thinking_by_default: bool) -> int:
    """The tokenizer in `source` (the demo's ChatML one) with the markers added after its ids and the
    family's template, written to `out_dir`; returns the vocabulary size (source ids, then the markers)."""
    source, out_dir = Path(source), Path(out_dir)
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    base = tok.get_vocab_size()
    if any(m in tok.get_vocab() for m in MARKERS):
        raise ValueError(f"`{source}/tokenizer.json` already has the family's markers")
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in MARKERS])
    assert [tok.token_to_id(m) for m in MARKERS] == list(range(base, base + len(MARKERS)))
    config = json.loads((source / "tokenizer_config.json").read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    for m in MARKERS:
        config["added_tokens_decoder"][str(tok.token_to_id(m))] = {
            "content": m, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True,
        }
    config["additional_special_tokens"] = [IM_START, IM_END, *MARKERS]
    config["chat_template"] = chat_template(thinking_by_default=thinking_by_default)
    config["model_max_length"] = context
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": config["additional_special_tokens"]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return tok.get_vocab_size()
