"""What MInTRL's loss logs, from sums its trainer has reduced over all processes, so that every process
logs the same numbers and takes the same absorption decision whatever layout the loss was computed on (the padded
rows of `MInTRLTrainer`, the packed loss terms of `AsyncMInTRLTrainer`)."""

from __future__ import annotations

import torch

from .absorption import warn_not_absorbed


def log_loss_totals(trainer, mode: str, totals: torch.Tensor) -> None:
    """Log one loss computation's `mintrl/judge_token_nll` (mean -log pi_theta of the judge tokens), `entropy` (per
    completion token) and `mintrl/regression_residual` (root mean square over the sequences in the regression), and
    in training feed the absorption tracker (`trainer.absorption`, warning once per run).

    Args:
        trainer: has `_metrics[mode]`, `absorption`, `state`, `args` and `accelerator`.
        mode: "train" or "eval".
        totals: (6,) sums over all processes, in this order: judge-token NLL, judge tokens, entropy, completion
            tokens, squared residuals, sequences in the regression.
    """
    judge_nll, judge_tokens, entropy, tokens, squared_residuals, sequences = totals.tolist()
    metrics = trainer._metrics[mode]
    if judge_tokens > 0:
        metrics["mintrl/judge_token_nll"].append(judge_nll / judge_tokens)
    if mode == "train":
        trend, warn = trainer.absorption.update(trainer.state.global_step, judge_nll, judge_tokens)
        if trend is not None and judge_tokens > 0:
            metrics["mintrl/judge_nll_trend"].append(trend.fall)
            metrics["mintrl/corrections_not_absorbed"].append(float(trend.not_absorbed))
        if warn and trainer.accelerator.is_main_process:
            warn_not_absorbed(trainer.args, trend)
    metrics["entropy"].append(entropy / max(tokens, 1.0))
    if sequences > 0:
        metrics["mintrl/regression_residual"].append((squared_residuals / sequences) ** 0.5)
