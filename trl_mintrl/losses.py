"""The two methods' losses as small pure functions on tensors, and the one table of their variants: `ANCHORS`
(MInTRL's `anchor`) and `REPAIR_WEIGHTINGS` (SORT's `repair_weighting`). A new variant is one function and one
entry here; the configs take their choices from these tables.

Shapes: B rows (rollouts or references), T completion/reference tokens. Masks are 0/1 floats or bools.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch


def _proxy_anchors(old_logps: torch.Tensor, judge_mask: torch.Tensor, kappa: float) -> torch.Tensor:
    return old_logps


def _const_anchors(old_logps: torch.Tensor, judge_mask: torch.Tensor, kappa: float) -> torch.Tensor:
    return torch.where(judge_mask.bool(), torch.full_like(old_logps, kappa), old_logps)


# MInTRL's `anchor` variants: judge tokens anchored at log pi_old ("proxy") or at the constant kappa ("const")
ANCHORS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "const": _const_anchors,
    "proxy": _proxy_anchors,
}


def regression_token_masks(
    completion_mask: torch.Tensor, tool_mask: torch.Tensor | None, judge_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(regressed, judge): (B, T) bool masks of the tokens in MInTRL's regression (policy and judge tokens) and of
    the judge tokens among them. Environment tokens (tool results) are in neither: no gradient, no anchor.

    Args:
        completion_mask: (B, T) 1 on completion tokens, 0 on padding and on rows `mask_truncated_completions` drops.
        tool_mask: (B, T) TRL's `tool_mask`: 1 on policy tokens, 0 on judge and environment tokens; None: all policy.
        judge_mask: (B, T) 1 on judge tokens; None: every non-policy token is the judge's (a rollout without tools).
    """
    completion = completion_mask.bool()
    policy = torch.ones_like(completion) if tool_mask is None else tool_mask.bool()
    judge = (~policy if judge_mask is None else judge_mask.bool()) & completion
    return (policy | judge) & completion, judge


def mintrl_anchors(old_logps: torch.Tensor, judge_mask: torch.Tensor, anchor: str, kappa: float) -> torch.Tensor:
    """(B, T) regression anchors a_t, detached: log pi_old on every token, except judge tokens under `const`,
    which get the constant kappa (a weak policy gives judge tokens very low probability; anchoring them there
    would over-constrain the regression).

    Args:
        old_logps: (B, T) log pi_old of each completion token (the policy that sampled the batch).
        judge_mask: (B, T) True on judge tokens (the judge's corrections), False on policy tokens and padding.
        anchor: a key of `ANCHORS`: "const" (judge tokens anchored at kappa) or "proxy" (at log pi_old).
        kappa: the constant anchor of judge tokens (paper: -0.2 math, -0.1 code).
    """
    if anchor not in ANCHORS:
        raise ValueError(f"anchor={anchor!r}: use 'const' or 'proxy'.")
    return ANCHORS[anchor](old_logps.detach(), judge_mask, kappa)


def advantage_regression_loss(
    per_token_logps: torch.Tensor,
    anchor_logps: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    beta: float,
    in_regression: torch.Tensor | None = None,
    num_rows: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MInTRL's sequence-level advantage regression (no ratio, no clipping, no importance sampling).

    `l(y) = (beta * sum_t mask_t * (log pi_theta(y_t) - a_t) - A(y))**2`, summed over the rows in the regression and
    divided by `num_rows`. By default that is the mean over those rows; a micro-batch of a larger batch passes its
    share of the larger batch's row count, so that its micro-batches add up to the mean over all of its rows.

    Args:
        per_token_logps: (B, T) log pi_theta of each completion token, with grad.
        anchor_logps: (B, T) anchors a_t (see `mintrl_anchors`); gradients never flow into them.
        mask: (B, T) 1 on completion tokens (policy and judge alike), 0 on padding.
        advantages: (B,) A(y) = r(y) - mean reward of the prompt's control rollouts.
        beta: the regression temperature (paper's beta2, 1e-3).
        in_regression: (B,) bool, False on rows left out of the regression (truncated completions under
            `mask_truncated_completions`): weight 0 and not counted in the mean. None: every row.
        num_rows: what the summed squared residuals are divided by; None: the rows in the regression here, at
            least 1 (a batch without any has loss 0).

    Returns:
        (loss, residuals): the scalar loss, and the (B,) residuals `beta * sum_t mask_t * (log pi_theta - a_t) - A`
        of every row, left-out rows included (`mintrl/regression_residual` is over the rows in the regression).
    """
    mask = mask.to(per_token_logps.dtype)
    log_ratio_sum = ((per_token_logps - anchor_logps.detach()) * mask).sum(dim=-1)
    residuals = beta * log_ratio_sum - advantages.to(per_token_logps.dtype)
    if in_regression is None:
        in_regression = torch.ones_like(residuals, dtype=torch.bool)
    squares = torch.where(in_regression.bool(), residuals.pow(2), torch.zeros_like(residuals))
    if num_rows is None:
        num_rows = in_regression.sum().clamp(min=1)
    return squares.sum() / num_rows, residuals


def packed_advantage_regression_loss(
    per_token_logps: torch.Tensor,
    anchor_logps: torch.Tensor,
    segment_id: torch.Tensor,
    advantages: torch.Tensor,
    beta: float,
    num_sequences: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`advantage_regression_loss` on a packed row's loss terms (TRL's async trainer: M terms, one per trained
    token of each sequence, a shared prompt token counted once per sequence that trains on it), so that a sequence
    written by older weights is regressed as it is: its sum over tokens is taken per `segment_id`, then the same
    residual, square and mean as the padded layout.

    Args:
        per_token_logps: (M,) log pi_theta of each term's target token, with grad.
        anchor_logps: (M,) anchors a_t (see `mintrl_anchors`); gradients never flow into them.
        segment_id: (M,) long, the index of the sequence each term belongs to (TRL's `segment_id`).
        advantages: (M,) A(y) of each term's sequence (TRL repeats a sequence's advantage on each of its terms).
        beta: the regression temperature.
        num_sequences: what the summed squared residuals are divided by; None: the sequences here, at least 1.

    Returns:
        (loss, residuals): the scalar loss, and the (S,) residuals `beta * sum_t (log pi_theta - a_t) - A` of the S
        sequences that have at least one term, in ascending `segment_id` (a sequence without terms has no row).
    """
    segments, term_sequence = torch.unique(segment_id, return_inverse=True)
    log_ratio_sums = per_token_logps.new_zeros(len(segments)).index_add_(
        0, term_sequence, per_token_logps - anchor_logps.detach()
    )
    sequence_advantages = advantages.new_zeros(len(segments)).scatter_(0, term_sequence, advantages)
    return advantage_regression_loss(
        log_ratio_sums[:, None],
        torch.zeros_like(log_ratio_sums[:, None]),
        torch.ones_like(log_ratio_sums[:, None]),
        sequence_advantages,
        beta,
        num_rows=num_sequences,
    )


def control_baseline_advantages(rewards: torch.Tensor, is_control: torch.Tensor, group_size: int) -> torch.Tensor:
    """MInTRL's advantages: `A = r - V(x)` with `V(x)` the mean reward of the prompt's control rollouts.

    Args:
        rewards: (N,) rewards of N = prompts * group_size rollouts, grouped in consecutive rows; NaN = unscorable.
        is_control: (N,) True on the control (purely on-policy) rollouts.
        group_size: rollouts per prompt.

    Returns:
        (N,) advantages, no division by the std. Unscorable rollouts, and every rollout of a group without a
        scorable control, get 0 (no baseline, no signal).
    """
    grouped = rewards.view(-1, group_size)
    controls = torch.where(is_control.view(-1, group_size), grouped, torch.full_like(grouped, float("nan")))
    baseline = torch.nanmean(controls, dim=1, keepdim=True)
    return torch.nan_to_num(grouped - baseline, nan=0.0).view(-1)


def sort_repair_weights(base_logps: torch.Tensor, plan_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """(B, T) SORT token weights `stopgrad(p_base**(1 - beta) * p_plan**beta)`; beta=1/2 is the geometric mean."""
    return torch.exp((1.0 - beta) * base_logps.detach() + beta * plan_logps.detach())


class RepairTerms(NamedTuple):
    """What SORT's repair computes: the loss to backpropagate and the per-token quantities it logs."""

    loss: torch.Tensor  # scalar, gradients through base_logps only
    weights: torch.Tensor  # (B, T) w_t, detached
    salience: torch.Tensor | None  # (B, T) log p_plan - log p_base, detached; None without a plan


def sort_repair_terms(
    base_logps: torch.Tensor, plan_logps: torch.Tensor, mask: torch.Tensor, beta: float
) -> RepairTerms:
    """SORT's salience-weighted repair loss on reference tokens, with its weights and salience.

    Args:
        base_logps: (B, T) log pi_theta(y*_t | base_prompt(q), y*_<t), with grad (the only path gradients take).
        plan_logps: (B, T) log pi(y*_t | teacher_prompt(q, plan), y*_<t); used only inside the weights.
        mask: (B, T) 1 on reference tokens, 0 on padding.
        beta: exponent of the plan probability; 0 gives DFT-style weights p_base, 1 gives plan-only weights p_plan.

    Returns:
        loss `-(w * base_logps * mask).sum() / mask.sum()`, weights `w` and salience `log p_plan - log p_base`.
    """
    mask = mask.to(base_logps.dtype)
    weights = sort_repair_weights(base_logps, plan_logps, beta)
    loss = -(weights * base_logps * mask).sum() / mask.sum().clamp(min=1.0)
    return RepairTerms(loss, weights, (plan_logps - base_logps).detach())


def reference_nll_loss(base_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SORT's repair with uniform weights: the mean negative log-likelihood of the reference tokens (plain SFT on
    references, ReLIFT-like), the ablation that isolates the plan salience. Shapes as in `sort_repair_terms`."""
    mask = mask.to(base_logps.dtype)
    return -(base_logps * mask).sum() / mask.sum().clamp(min=1.0)


def uniform_repair_terms(
    base_logps: torch.Tensor, plan_logps: torch.Tensor | None, mask: torch.Tensor, beta: float
) -> RepairTerms:
    """`reference_nll_loss` as `RepairTerms`: weight 1 on every token, no plan, no salience."""
    return RepairTerms(reference_nll_loss(base_logps, mask), torch.ones_like(mask), None)


@dataclass(frozen=True)
class RepairWeighting:
    """A SORT `repair_weighting` variant: its terms, and whether it needs the plan (the planner's generate call
    and the teacher scoring pass are skipped without one)."""

    terms: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, float], RepairTerms]
    uses_plan: bool


# SORT's `repair_weighting` variants: the paper's plan-salience weights, or plain SFT on the references
REPAIR_WEIGHTINGS: dict[str, RepairWeighting] = {
    "salience": RepairWeighting(sort_repair_terms, uses_plan=True),
    "uniform": RepairWeighting(uniform_repair_terms, uses_plan=False),
}
