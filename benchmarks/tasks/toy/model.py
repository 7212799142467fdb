"""A character-level tokenizer and a ~1M-parameter Qwen3 model for the toy arithmetic task.

Characters are tokens, so a completion decodes and re-encodes to the same ids, a cut at a step boundary is exact,
and digits are never merged. The vocabulary covers printable ASCII and newline, so judge, plan and teacher prompts
(English text) tokenise too.
"""

from __future__ import annotations

import string
from pathlib import Path

from trl_mintrl.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS, build_qwen3_model

CHARACTERS = "\n" + "".join(ch for ch in string.printable if ch.isprintable())


def build_char_tokenizer():
    """A `PreTrainedTokenizerFast` with one token per character, the tiny model's chat template and special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, "<unk>", *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[1:2],
        padding_side="left",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_toy_model(
    tokenizer, hidden_size: int = 128, num_layers: int = 4, intermediate_size: int = 384, seed: int = 0
):
    """A randomly initialised Qwen3 causal LM sized for the toy task (about 0.8M parameters by default)."""
    return build_qwen3_model(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        intermediate_size=intermediate_size,
        max_position_embeddings=2048,
        seed=seed,
    )


def save(model, tokenizer, out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
