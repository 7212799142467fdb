"""Held-out evaluation on toy problems: sample `n_samples` completions per problem, report unbiased pass@k."""

from __future__ import annotations

import re
from collections.abc import Sequence

from trl_mintrl.eval import pass_at_k

from .task import OFFSETS, Problem

_STEP = re.compile(rf"\d+\s*[-+{''.join(OFFSETS)}]\s*\d+\s*=")


def sample_completions(
    model,
    tokenizer,
    problems: Sequence[Problem],
    n_samples: int,
    *,
    temperature: float = 1.0,
    batch_size: int = 256,
    max_new_tokens: int | None = None,
    seed: int = 0,
    prompt_fn=None,
) -> list[list[str]]:
    """`n_samples` completions per problem (temperature sampling, top-p 1), reproducible for a seed. `prompt_fn`:
    `Problem -> prompt` (default: the problem's own prompt; e.g. `hint.hinted_prompt_fn()` states the rule first)."""
    from trl_mintrl.text import prompt_token_ids

    if max_new_tokens is None:
        max_new_tokens = 2 * max(len(p.solution) for p in problems) + 8
    rows = [
        (i, prompt_token_ids(tokenizer, prompt_fn(p) if prompt_fn else p.row()["prompt"]))
        for i, p in enumerate(problems)
        for _ in range(n_samples)
    ]
    texts = sample_texts(
        model, tokenizer, [ids for _, ids in rows], max_new_tokens, temperature=temperature, batch_size=batch_size,
        seed=seed,
    )  # fmt: skip
    completions: list[list[str]] = [[] for _ in problems]
    for (i, _), text in zip(rows, texts, strict=True):
        completions[i].append(text)
    return completions


def sample_texts(
    model, tokenizer, prompts: list[list[int]], max_new_tokens: int, *, temperature=1.0, batch_size=256, seed=0
) -> list[str]:
    """One sampled completion (decoded, special tokens dropped) per token-id prompt, in order; reproducible for a
    seed; batches of similar prompt lengths (less padding)."""
    import torch
    from transformers import GenerationConfig

    from trl_mintrl.engines import TransformersEngine

    config = GenerationConfig(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
    engine = TransformersEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], generation_config=config
    )
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    texts: list[str] = [""] * len(prompts)
    was_training = model.training
    model.eval()
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            outputs = engine.generate([prompts[i] for i in batch], max_new_tokens)
            decoded = tokenizer.batch_decode([o.token_ids for o in outputs], skip_special_tokens=True)
            for i, text in zip(batch, decoded, strict=True):
                texts[i] = text
    finally:
        torch.random.set_rng_state(rng_state)
        model.train(was_training)
    return texts


def evaluate(
    model, tokenizer, problems: Sequence[Problem], n_samples: int = 8, ks: Sequence[int] = (1, 8), **kwargs
) -> dict[str, float]:
    """Mean unbiased pass@k over `problems` for each k <= n_samples (keys `pass@k`; a sample passes when
    `Problem.solved`: the right answer, and on the out-of-reach regime its `@` step right too), plus the share of samples that
    write fewer (`too_few_steps`) or more (`too_many_steps`) computation steps than the problem has operations."""
    return scores_of(problems, sample_completions(model, tokenizer, problems, n_samples, **kwargs), ks)


def scores_of(problems: Sequence[Problem], completions: list[list[str]], ks: Sequence[int] = (1, 8)) -> dict:
    """`evaluate`'s scores of completions already sampled (n per problem), e.g. of a prefix of an evaluated set."""
    n_samples = len(completions[0])
    correct = [sum(map(p.solved, texts)) for p, texts in zip(problems, completions, strict=True)]
    scores = {
        f"pass@{k}": sum(pass_at_k(n_samples, int(c), k) for c in correct) / len(problems)
        for k in ks
        if k <= n_samples
    }
    steps = [(count_steps(t), p.num_ops) for p, texts in zip(problems, completions, strict=True) for t in texts]
    scores["too_few_steps"] = sum(n < ops for n, ops in steps) / len(steps)
    scores["too_many_steps"] = sum(n > ops for n, ops in steps) / len(steps)
    return scores


def count_steps(text: str) -> int:
    """Computation steps (`a+b=c` lines) written before the answer."""
    return len(_STEP.findall(text.split("Answer:")[0]))


def difficulty_table(model_path, n_problems: int = 200, ops=range(1, 13), n_samples: int = 8, seed: int = 1234) -> str:
    """Markdown table of pass@1 / pass@8 by number of operations, on fresh problems (not the training stream)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .task import make_problems

    model = AutoModelForCausalLM.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    lines = [f"| ops | pass@1 | pass@{n_samples} |", "|---|---|---|"]
    for n_ops in ops:
        scores = evaluate(model, tokenizer, make_problems(n_problems, n_ops, n_ops, seed=seed + n_ops), n_samples)
        lines.append(f"| {n_ops} | {scores['pass@1']:.3f} | {scores[f'pass@{n_samples}']:.3f} |")
    return "\n".join(lines)
