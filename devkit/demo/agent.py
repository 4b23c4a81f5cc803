"""A tiny tokenizer and model pair in the Qwen3.5 family's chat format, for the agent-API tests.

The shipped demo tokenizer must keep its ids (a trained model depends on them), so this one is
a copy with the family's markers added as special tokens (`<think>`, `</think>`, `<tool_call>`,
...) and a chat template in the family's form: tools rendered into the system prompt, assistant
`tool_calls` as `<tool_call>` / `<function=NAME>` / `<parameter=P>` blocks, `tool` messages as
`<tool_response>` blocks in a user turn, and `<think>` opened in the generation prompt unless
`enable_thinking` is false. mlx-lm's tokenizer wrapper infers from it the `qwen3_coder` tool
parser and the `<think>` markers, as it does for the real models.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from tokenizers import AddedToken, Tokenizer

from devkit.demo import TOKENIZER_DIR
from devkit.demo.bpe import ENDOFTEXT, IM_END, IM_START
from devkit.demo.modeldir import build_model, qwen3_config, save_model_dir
from devkit.demo.tiny import LATER_LAYER_GAIN, PROJECTION_GAIN, TINY_TARGET

#: Tool definitions fill the system prompt: the demo's 512-token context is too small for them.
CONTEXT = 4096
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

#: The Qwen3.5 family's chat format, condensed to what the API exercises.
CHAT_TEMPLATE = (
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
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


def build_agent_tokenizer(out_dir: Path) -> int:
    """Write the tokenizer files to `out_dir`; return the vocabulary size (demo ids, then the markers)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in MARKERS])
    tok.save(str(out_dir / "tokenizer.json"))
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    for m in MARKERS:
        config["added_tokens_decoder"][str(tok.token_to_id(m))] = {
            "content": m, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True,
        }
    config["additional_special_tokens"] = [IM_START, IM_END, *MARKERS]
    config["chat_template"] = CHAT_TEMPLATE
    config["model_max_length"] = CONTEXT
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": config["additional_special_tokens"]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return tok.get_vocab_size()


def build_agent_pair(out_dir: Path, *, seed: int = 0, drafter_from_target: bool = False) -> tuple[Path, Path]:
    """`out_dir/target` (2 layers x 64) and `out_dir/drafter` (its first layer, or a copy of it) on the agent tokenizer."""
    out_dir = Path(out_dir)
    tok_dir = out_dir / "tokenizer"
    vocab = build_agent_tokenizer(tok_dir)
    mx.random.seed(seed)
    config = qwen3_config(**TINY_TARGET, vocab_size=vocab, max_position_embeddings=CONTEXT)
    config["tie_word_embeddings"] = False
    config["eos_token_id"] = [Tokenizer.from_file(str(tok_dir / "tokenizer.json")).token_to_id(t) for t in (IM_END, ENDOFTEXT)]
    target = build_model(config)
    for i, layer in enumerate(target.model.layers):
        gain = PROJECTION_GAIN
        params = tree_flatten(layer.parameters())
        layer.update(tree_unflatten([(k, v * gain if k.endswith("proj.weight") else v) for k, v in params]))
        if i > 0:
            layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * LATER_LAYER_GAIN
            layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * LATER_LAYER_GAIN
    mx.eval(target.parameters())
    target_dir = save_model_dir(target, config, out_dir / "target", tokenizer_dir=tok_dir)
    drafter_dir = out_dir / "drafter"
    if drafter_from_target:
        shutil.copytree(target_dir, drafter_dir, dirs_exist_ok=True)
        return target_dir, drafter_dir
    drafter = build_model(dict(config, num_hidden_layers=1))
    drafter.model.embed_tokens = target.model.embed_tokens
    drafter.model.layers[0] = target.model.layers[0]
    drafter.model.norm = target.model.norm
    drafter.lm_head = target.lm_head
    save_model_dir(drafter, dict(config, num_hidden_layers=1), drafter_dir, tokenizer_dir=tok_dir)
    return target_dir, drafter_dir
