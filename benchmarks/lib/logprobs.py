"""Log-probabilities of target tokens after a context under a causal LM, without gradients: the NLLs of the
calibrations (toy and real model) and the real model's chat and judge-token measures."""

from __future__ import annotations


def token_ids(tokenizer, text: str) -> list[int]:
    """The ids of a piece of text inside a sequence: no special tokens, none for empty text."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def token_logprobs(model, pairs: list[tuple[list[int], list[int]]], batch_size: int = 16) -> list[list[float]]:
    """log p(target_t | context, target_<t) of every target token, per (context ids, target ids) pair; right-padded
    batches, no gradient, temperature 1."""
    import torch

    out = []
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        width = max(len(c) + len(t) for c, t in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (context, target) in enumerate(batch):
            ids[row, : len(context) + len(target)] = torch.tensor(context + target)
            mask[row, : len(context) + len(target)] = 1
        with torch.no_grad():
            logps = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
        for row, (context, target) in enumerate(batch):
            positions = torch.arange(len(context) - 1, len(context) + len(target) - 1)
            out.append(logps[row, positions, torch.tensor(target)].tolist())
    return out


def sequence_nll(model, pairs: list[tuple[list[int], list[int]]], batch_size: int = 16) -> list[float]:
    """-sum log p(target | context) in nats per (context ids, target ids) pair (`token_logprobs` summed)."""
    return [-sum(logps) for logps in token_logprobs(model, pairs, batch_size)]
