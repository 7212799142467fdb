"""What the real-model comparison measures of a policy (`benchmarks/studies/learning_real.py`): held-out pass@k by the
package's math reward, the mean per-token KL to the warm start on the policy's own samples, and the chat answers' NLL
(`scoring.chat_nll`). Sampling runs through `scoring.sample` with the torch RNG restored afterwards, so measuring in
the middle of training does not change the training run's own random stream."""

from __future__ import annotations

import statistics

from benchmarks.lib.logprobs import token_logprobs

from .scoring import chat_nll, sample
from .task import chat_dataset

SAMPLES = 8  # per problem: pass@1 is the mean over 8 samples, pass@8 the unbiased estimate from the same 8


def held_out_samples(
    model, tokenizer, problems, max_new_tokens: int, *, seed: int, samples: int = SAMPLES, engine=None
) -> dict:
    """`samples` completions per problem at temperature 1 (top-p 1, no top-k), as token ids (prompt and completion,
    EOS kept when the model stopped) and text, and the seconds sampling took; with `engine`, drawn by it
    (`scoring.sample`)."""
    import time

    import torch

    from trl_mintrl.text import prompt_token_ids

    prompts = [prompt_token_ids(tokenizer, p.prompt) for p in problems for _ in range(samples)]
    began = time.perf_counter()
    was_training = model.training
    with torch.random.fork_rng():
        generations, _ = sample(model, tokenizer, prompts, max_new_tokens, seed=seed, batch_size=64, engine=engine)
    model.train(was_training)
    ids = [list(g.token_ids) for g in generations]
    return {
        "prompts": prompts,
        "completions": ids,
        "texts": tokenizer.batch_decode(ids, skip_special_tokens=True),
        "capped": [not c or c[-1] != tokenizer.eos_token_id for c in ids],
        "seconds": time.perf_counter() - began,
        "samples": samples,
    }


def pass_scores(problems, drawn: dict, first: int | None = None) -> dict:
    """pass@1 and pass@8 (unbiased, by `trl_mintrl.rewards.math_reward` against each problem's `solution`), the share
    of samples that write `####`, that hit the token cap, and the mean completion tokens; over the first `first`
    problems when given (the curve set inside the held-out set)."""
    from trl_mintrl.eval import pass_at_k
    from trl_mintrl.rewards import math_reward

    n = drawn["samples"]
    problems = problems[:first] if first is not None else problems
    rows = len(problems) * n
    texts, capped = drawn["texts"][:rows], drawn["capped"][:rows]
    right = [r == 1.0 for r in math_reward(texts, solution=[p.solution for p in problems for _ in range(n)])]
    groups = [right[i : i + n] for i in range(0, rows, n)]
    return {
        "pass@1": statistics.fmean(pass_at_k(n, sum(g), 1) for g in groups),
        "pass@8": statistics.fmean(pass_at_k(n, sum(g), min(8, n)) for g in groups),
        "writes_hash": statistics.fmean("####" in t for t in texts),
        "capped": statistics.fmean(capped),
        "mean_tokens": statistics.fmean(len(c) for c in drawn["completions"][:rows]),
        "problems": len(problems),
    }


def kl_to(policy, reference, drawn: dict, problems: int | None = None) -> dict:
    """The mean per-token KL of `policy` to `reference` on the policy's own samples `drawn` (`held_out_samples`; of
    its first `problems` problems when given): the mean over every sampled token of log pi(y_t) - log pi_0(y_t) (a
    Monte Carlo estimate of KL(pi || pi_0)), with the tokens it averages over and the seconds it took."""
    import time

    began = time.perf_counter()
    rows = len(drawn["prompts"]) if problems is None else problems * drawn["samples"]
    pairs = [(p, c) for p, c in zip(drawn["prompts"][:rows], drawn["completions"][:rows], strict=True) if c]
    was_training = policy.training
    policy.eval()
    mine, theirs = token_logprobs(policy, pairs), token_logprobs(reference, pairs)
    policy.train(was_training)
    diffs = [a - b for row_a, row_b in zip(mine, theirs, strict=True) for a, b in zip(row_a, row_b, strict=True)]
    return {
        "kl_per_token": statistics.fmean(diffs) if diffs else 0.0,
        "tokens": len(diffs),
        "seconds": time.perf_counter() - began,
    }


def chat_kept(model, tokenizer) -> dict:
    """The chat answers' NLL (`task.CHAT`, `scoring.chat_nll`): what the model keeps of being a chat model."""
    was_training = model.training
    model.eval()
    out = chat_nll(model, tokenizer, chat_dataset())
    model.train(was_training)
    return out
