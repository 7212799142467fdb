"""Measurements on the real model shared by the calibration and the comparison: sampling through the package's
`TransformersEngine` and the chat conversations' NLL (what a method keeps of the
chat model)."""

from __future__ import annotations

from benchmarks.lib.logprobs import sequence_nll, token_ids


def sample(
    model,
    tokenizer,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    seed: int,
    batch_size: int = 32,
    temperature: float = 1.0,
    top_k: int = 0,
    on_batch=None,
    engine=None,
):
    """One completion per token-id prompt at `temperature` (default 1, top-p 1, no top-k: TRL's GRPO defaults), as
    `Generation`s (token ids, ending with EOS when the model stopped), and the seconds each batch took. Batches hold
    prompts of similar length (less padding); reproducible for a seed. `on_batch(index, batches, seconds, rows)` is
    called after each batch (progress, a first-batch estimate). `engine`: a trainer's generation engine to sample
    with instead of `model` through `transformers` (a colocated vLLM engine, `VLLMEngine.from_trainer`, which syncs the
    trainer's weights first: about 4x faster here, benchmarks/results/real_engines.md); it samples with its own
    settings (the trainer's), the same distribution where they are these, and its draws follow vLLM's random state,
    not `seed`."""
    import time

    import torch
    from transformers import GenerationConfig

    from trl_mintrl.engines import TransformersEngine

    config = GenerationConfig(do_sample=True, temperature=temperature, top_p=1.0, top_k=top_k)
    engine = engine or TransformersEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], generation_config=config
    )
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out, seconds = [None] * len(prompts), []
    model.eval()
    torch.manual_seed(seed)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        began = time.perf_counter()
        with torch.no_grad():
            generations = engine.generate([prompts[i] for i in batch], max_new_tokens)
        seconds.append(time.perf_counter() - began)
        if on_batch is not None:
            on_batch(len(seconds) - 1, -(-len(order) // batch_size), seconds[-1], len(batch))
        for i, generation in zip(batch, generations, strict=True):
            out[i] = generation
    return out, seconds


def chat_nll(model, tokenizer, dataset) -> dict:
    """NLL of each conversation's answer (the assistant turn's content, then the end-of-turn token) after its prompt
    through the chat template: `nats_per_token` (over all answer tokens), `mean_nats_per_answer`, `answers`,
    `tokens`."""
    from trl_mintrl.text import prompt_token_ids

    pairs = []
    for row in dataset:
        context = prompt_token_ids(tokenizer, row["prompt"])
        target = token_ids(tokenizer, row["completion"][-1]["content"]) + [tokenizer.eos_token_id]
        pairs.append((context, target))
    nats = sequence_nll(model, pairs)
    tokens = sum(len(t) for _, t in pairs)
    return {
        "nats_per_token": sum(nats) / tokens,
        "mean_nats_per_answer": sum(nats) / len(nats),
        "answers": len(nats),
        "tokens": tokens,
    }
