"""An offline tiny causal LM + tokenizer for tests, CPU demos and benchmarks.

Nothing is downloaded: a byte-level BPE tokenizer is trained with `tokenizers` on generated text (arithmetic,
`\\boxed{}` answers, a little code and prose), and a randomly initialised Qwen3 model of a few million parameters
is saved next to it. `AutoTokenizer.from_pretrained(out_dir)` and `AutoModelForCausalLM.from_pretrained(out_dir)`
load the result like any Hub checkpoint. Building takes a few seconds and is deterministic for a seed.
"""

from __future__ import annotations

import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_WORDS = (
    "the answer is so we get step first then compute check add subtract multiply divide number result "
    "solve problem let write sum total each case equation value therefore because final reason verify plan "
    "key lemma substitution split wrong correct keep revise review judge solution reference question"
).split()

_CODE = [
    "def solve(a, b):\n    return a + b\n",
    "```python\nn = int(input())\nprint(n * 2)\n```\n",
    "for i in range(n):\n    total += i\n",
    "import sys\ndata = sys.stdin.read().split()\nprint(sum(map(int, data)))\n",
    "def f(x):\n    if x < 0:\n        return -x\n    return x\n",
]


def _corpus(rng: random.Random, n_lines: int) -> list[str]:
    """Text that exercises every kind of token the tests and demos produce."""
    lines = []
    for _ in range(n_lines):
        kind = rng.randrange(4)
        if kind == 0:
            terms = [str(rng.randrange(10)) for _ in range(rng.randrange(2, 6))]
            ops = [rng.choice("+-*") for _ in terms[1:]]
            expr = terms[0] + "".join(o + t for o, t in zip(ops, terms[1:]))
            lines.append(
                f"Compute {expr} = \n\n{expr[:3]}={rng.randrange(100)}\n\nAnswer: \\boxed{{{rng.randrange(100)}}}"
            )
        elif kind == 1:
            lines.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randrange(4, 14))) + ".")
        elif kind == 2:
            lines.append(rng.choice(_CODE))
        else:
            a, b = rng.randrange(1000), rng.randrange(1000)
            lines.append(f"{a} + {b} = {a + b}\n\nThe final answer is \\boxed{{{a + b}}}.")
    return lines


def build_tiny_tokenizer(vocab_size: int = 1024, seed: int = 0):
    """Train a byte-level BPE tokenizer on generated text and wrap it as a `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Digits stay single tokens (as in Qwen/Llama3 tokenizers' digit splitting would): arithmetic stays learnable.
    tokenizer.train_from_iterator(_corpus(random.Random(seed), 4000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        padding_side="left",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 192,
    num_layers: int = 4,
    intermediate_size: int = 576,
    vocab_size: int = 1024,
    max_position_embeddings: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a tiny Qwen3 causal LM and its tokenizer to `out_dir` and return the path.

    head_dim is fixed at 32 (vLLM's kernels need it); attention heads = hidden_size // 32, key/value heads half of
    that. Two builds with the same arguments produce identical files.
    """
    if hidden_size % 32:
        raise ValueError(f"hidden_size={hidden_size} must be a multiple of 32 (head_dim is 32).")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(vocab_size=vocab_size, seed=seed)
    model = build_qwen3_model(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_qwen3_model(
    tokenizer, *, hidden_size: int, num_layers: int, intermediate_size: int, max_position_embeddings: int, seed: int
):
    """A randomly initialised Qwen3 causal LM for `tokenizer` (head_dim 32, KV heads half the attention heads),
    initialised from `seed` without disturbing the global torch RNG."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    n_heads = hidden_size // 32
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=max(1, n_heads // 2),
        head_dim=32,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model
