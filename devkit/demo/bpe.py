"""The demo tokenizer: byte-level BPE trained with `tokenizers` on local code and prose.

Saved as `tokenizer.json` plus a `tokenizer_config.json` that transformers (and so mlx-lm) loads as a
`PreTrainedTokenizerFast` with a ChatML chat template. Byte-level means every string round-trips,
whatever characters a client sends.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from devkit.demo import corpus

VOCAB_SIZE = 1024
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
MODEL_MAX_LENGTH = 512

#: ChatML. Content may be a string or a list of `{"type": "text", "text": ...}` parts (OpenAI's
#: multi-part form, which mlx-vlm's server always sends); the parts' texts are joined.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_config(tok: Tokenizer) -> dict:
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), indent=2) + "\n")
    special = {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": [IM_START, IM_END]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def eos_token_ids(tokenizer_dir: Path) -> list[int]:
    """Ids of `<|im_end|>` and `<|endoftext|>`: both end a generation."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)]


def build(out_dir: Path, *, code_chars: int = 3_000_000, prose_chars: int = 3_000_000) -> Tokenizer:
    texts = corpus.sample(corpus.code_texts(), code_chars) + corpus.sample(corpus.prose_texts(), prose_chars)
    tok = train_tokenizer(texts)
    save_tokenizer(tok, out_dir)
    return tok


if __name__ == "__main__":
    import sys

    from devkit.demo import TOKENIZER_DIR

    built = build(TOKENIZER_DIR)
    print(f"wrote {TOKENIZER_DIR} (vocab {built.get_vocab_size()})", file=sys.stderr)
