"""Warm start: supervised training of the toy model, so that on longer RL problems its pass@1 is low and many groups
are all wrong (the regime the papers target).

Problems have 1-10 operations with longer ones exponentially rarer (weight 0.7 per extra operation), and training
stops early (500 steps of 32 problems, ~4 min on one core): the model solves short problems, slips more and more as
chains grow, and is still stochastic enough at temperature 1 for RL to explore. Deterministic for a seed (one CPU
thread), so `python -m benchmarks.tasks.toy.warm_start_build` rebuilds the committed checkpoint.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

from .hint import HINT_MAX_OPS, HINT_MIN_OPS, make_hinted_example
from .model import build_char_tokenizer, build_toy_model, save
from .task import make_problem

WARM_START_DIR = Path(__file__).parent / "warm_start"
SFT_MIN_OPS, SFT_MAX_OPS, SFT_OPS_DECAY = 1, 10, 0.7


def sft_batch(tokenizer, examples) -> dict:
    """Right-padded input ids, attention mask and labels (completion tokens only) for `(prompt messages, solution
    text)` pairs."""
    from trl_mintrl.text import prompt_token_ids

    rows = []
    for messages, solution in examples:
        prompt = prompt_token_ids(tokenizer, messages)
        completion = tokenizer(solution, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + completion, [-100] * len(prompt) + completion))
    return pad_batch(tokenizer, rows)


def pad_batch(tokenizer, rows: list[tuple[list[int], list[int]]]) -> dict:
    """Right-padded input ids, attention mask and labels of `(ids, labels)` rows (-100: no loss)."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention_mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def build_warm_start(
    out_dir: str | Path = WARM_START_DIR,
    *,
    seed: int = 0,
    steps: int = 500,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    warmup_steps: int = 100,
    min_ops: int = SFT_MIN_OPS,
    max_ops: int = SFT_MAX_OPS,
    ops_decay: float = SFT_OPS_DECAY,
    log_every: int = 100,
    init_dir: str | Path | None = None,
    hint_fraction: float = 0.0,
) -> Path:
    """Train the toy model with next-token loss on reference solutions of `min_ops..max_ops`-operation problems.

    AdamW with linear warm-up and cosine decay to 10%, grad-norm clipping at 1.0. Runs on one CPU thread so the
    result is identical for a seed; writes the model and tokenizer to `out_dir`. `init_dir`: start from that
    checkpoint instead of a random model; `hint_fraction`: the share of each batch drawn as hinted examples
    (`hint.make_hinted_example`, 1..6 operations; 0 draws exactly the stream of before).
    """
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_char_tokenizer()
    if init_dir is None:
        model = build_toy_model(tokenizer, seed=seed)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(init_dir)
    model.train()
    optimizer = sft_optimizer(model, learning_rate)

    scheduler = warmup_cosine_schedule(optimizer, warmup_steps, steps)
    ops = list(range(min_ops, max_ops + 1))
    ops_weights = [ops_decay**i for i in range(len(ops))]
    start, running = time.time(), None
    for step in range(steps):
        n_hinted = round(hint_fraction * batch_size)
        problems = [make_problem(rng, rng.choices(ops, ops_weights)[0]) for _ in range(batch_size - n_hinted)]
        problems += [make_hinted_example(rng, rng.randint(HINT_MIN_OPS, HINT_MAX_OPS)) for _ in range(n_hinted)]
        loss = sft_step(model, optimizer, sft_batch(tokenizer, [(p.row()["prompt"], p.solution) for p in problems]))
        scheduler.step()
        running = loss if running is None else 0.98 * running + 0.02 * loss
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}/{steps}  loss {running:.4f}  {time.time() - start:.0f}s", flush=True)
    model.eval()
    return save(model, tokenizer, out_dir)


def warmup_cosine_schedule(optimizer, warmup_steps: int, steps: int):
    """The warm start's learning-rate schedule: linear warm-up over `warmup_steps`, then cosine decay to 10% at
    `steps`."""
    import torch

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)


def sft_optimizer(model, learning_rate: float):
    """The warm start's optimiser: AdamW, weight decay 0.01, betas (0.9, 0.98)."""
    import torch

    return torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01, betas=(0.9, 0.98))


def sft_step(model, optimizer, batch: dict) -> float:
    """One optimizer step of next-token loss on `batch` (`sft_batch`), grad norm clipped at 1.0; returns the loss."""
    import torch

    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def sft_on_references(model, tokenizer, dataset, *, batch_size: int, learning_rate: float) -> int:
    """One epoch of supervised fine-tuning on `dataset`'s rows (`prompt` messages, `solution` text) in their order,
    `batch_size` rows a step, with the warm start's optimiser at a constant `learning_rate`: what a user with
    reference solutions does before RL (the paper's SFT+GRPO baseline). Trains `model` in place on one CPU thread
    and leaves it in eval mode; returns the optimizer steps taken."""
    rows = list(zip(dataset["prompt"], dataset["solution"], strict=True))
    batches = (sft_batch(tokenizer, rows[start : start + batch_size]) for start in range(0, len(rows), batch_size))
    return sft_epoch(model, batches, learning_rate)


def sft_epoch(model, batches, learning_rate: float) -> int:
    """One pass of `sft_step` over `batches` with the warm start's optimiser at a constant `learning_rate`; leaves
    `model` in eval mode and returns the optimizer steps taken."""
    model.train()
    optimizer = sft_optimizer(model, learning_rate)
    steps = 0
    for batch in batches:
        sft_step(model, optimizer, batch)
        steps += 1
    model.eval()
    return steps
