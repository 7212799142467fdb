"""A MInTRL rollout batch's record (`RolloutBatch`), its measures (`RolloutMeasures`) and its `mintrl/*` metrics
(`rollout_metrics`): shared by `MInTRLTrainer` and the asynchronous rollout worker (`async_/worker.py`), and kept out
of the trainer's module so that the worker never imports the synchronous trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..judges import TransportStatus
from .rollout import Trajectory


@dataclass
class RolloutBatch:
    """What one `rollout_func` call hands to the advantage and metrics code, for this process's rows."""

    STAT_COLUMNS = (
        "intervened",
        "revised",
        "reviews",
        "judge_tokens",
        "completion_tokens",
        "judge_failures",
        "votes_usable",
        "votes_agreeing",
        "vetoed",
        "speculative_chunks",
        "speculative_kept",
        "tool_calls",
        "tool_failures",
        "policy_tokens_after_judge",
        "ended_by_judge",
        "truncated",
    )

    intervening: bool  # interventions were on for this batch
    is_control: torch.Tensor  # (rows,) bool: purely on-policy rollouts, whose mean reward is the baseline
    stats: torch.Tensor  # (rows, len(STAT_COLUMNS)) float per-rollout statistics
    prefix_cache_hit_rate: float | None  # engines with a cache (vLLM prefix blocks, transformers kept KV); else None
    judge_requests: float = 0.0  # requests sent to the judge's server (0 for in-process judges)
    judge_unanswered: float = 0.0  # ... of which got no answer (connection refused, timeout, HTTP error)
    judge_last_error: str | None = None  # why this process's latest unanswered request got none (not gathered)
    # this process's rows only (not gathered): each rollout's token roles (TRL's env_mask: 1 on policy tokens; 1 on
    # judge tokens), its completion's token ids, and its messages with tools (assistant turns and tool results)
    env_masks: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    judge_masks: list[list[int]] = field(default_factory=list)
    messages: list[list[dict]] = field(default_factory=list)

    @classmethod
    def from_trajectories(
        cls,
        trajectories: list[Trajectory],
        intervening: bool,
        is_control: torch.Tensor,
        prefix_cache_hit_rate: float | None,
        transport_before: TransportStatus,
        transport_after: TransportStatus,
        stop_token_ids: set[int],
    ) -> RolloutBatch:
        """The batch of a finished rollout; the judge's transport counts are the difference of its statuses read
        before and after the rollout. `stop_token_ids` (EOS and pad) tell a finished completion from one cut at
        `max_completion_length` (`is_truncated`)."""
        stats = [
            [
                t.review_budget > 0,
                t.revisions > 0,
                t.reviews,
                t.judge_tokens,
                t.written_tokens,  # tool results are in no share or length
                t.judge_failures,
                t.votes_usable,
                t.votes_agreeing,
                t.vetoed,
                t.speculative_chunks,
                t.speculative_kept,
                t.tool_calls,
                t.tool_failures,
                t.policy_tokens_after_judge,
                t.ended_by_judge,
                is_truncated(t, stop_token_ids),
            ]
            for t in trajectories
        ]
        more_unanswered = transport_after.unanswered > transport_before.unanswered
        return cls(
            intervening=intervening,
            is_control=is_control,
            stats=torch.tensor(stats, dtype=torch.float32, device=is_control.device),
            prefix_cache_hit_rate=prefix_cache_hit_rate,
            judge_requests=float(transport_after.sent - transport_before.sent),
            judge_unanswered=float(transport_after.unanswered - transport_before.unanswered),
            judge_last_error=transport_after.last_error if more_unanswered else None,
            env_masks=[t.env_mask for t in trajectories],
            completion_ids=[t.completion_ids for t in trajectories],
            judge_masks=[t.judge_mask for t in trajectories],
            messages=[t.messages for t in trajectories],
        )

    def judge_mask(self, width: int) -> torch.Tensor:
        """(rows, width) long: 1 on this process's judge tokens, right-padded with 0 as TRL pads completions."""
        mask = torch.zeros(len(self.judge_masks), width, dtype=torch.long, device=self.is_control.device)
        for row, judge in enumerate(self.judge_masks):
            mask[row, : len(judge)] = torch.tensor(judge, dtype=torch.long)
        return mask

    def stat(self, name: str) -> torch.Tensor:
        """(rows,) one column of `stats`."""
        return self.stats[:, self.STAT_COLUMNS.index(name)]

    def gathered(self, accelerator) -> RolloutBatch:
        """The batch over the global rows, in TRL's row order (a collective: every process calls it)."""
        rows = accelerator.gather(torch.cat([self.is_control.unsqueeze(1).to(self.stats.dtype), self.stats], dim=1))
        rate = self.prefix_cache_hit_rate
        if rate is not None:
            rate = accelerator.gather(torch.tensor([rate], device=self.stats.device)).mean().item()
        requests = torch.tensor([self.judge_requests, self.judge_unanswered], device=self.stats.device)
        sent, unanswered = accelerator.reduce(requests, reduction="sum").tolist()
        return RolloutBatch(
            self.intervening, rows[:, 0].bool(), rows[:, 1:], rate, sent, unanswered, self.judge_last_error
        )


def is_truncated(t: Trajectory, stop_token_ids: set[int]) -> bool:
    """Cut at `max_completion_length`: not ended by EOS (or pad), as TRL tells a clipped completion."""
    return bool(t.completion_ids) and t.completion_ids[-1] not in stop_token_ids


@dataclass(frozen=True)
class RolloutMeasures:
    """The numbers of one gathered batch that both the metrics and the schedule's controllers read."""

    judge_token_share: float  # judge tokens / completion tokens
    judge_failures: float  # failed judge requests: judge_transport_failures + judge_parse_failures
    judge_transport_failures: float  # requests that got no answer (connection refused, timeout, HTTP error)
    reviews: float  # reviews made (each is `judge_votes` judge calls)
    reward_control: float  # mean reward of the controls
    reward_intervened: float | None  # mean reward of the intervened rollouts; None when there are none
    length_control: float  # the controls' mean length in written tokens (no tool results)
    clipped_control: float  # the share of the controls cut at max_completion_length
    length_revised: float | None  # the mean length (written tokens, the judge's included) of the rollouts the judge
    # revised; None when it revised none
    reward_revised: float | None  # their mean reward; None when the judge revised none

    @classmethod
    def of(cls, rewards: torch.Tensor, rollout: RolloutBatch) -> RolloutMeasures:
        intervened = rollout.stat("intervened").bool()
        revised = rollout.stat("revised").bool()
        total_tokens = max(rollout.stat("completion_tokens").sum().item(), 1.0)
        return cls(
            judge_token_share=rollout.stat("judge_tokens").sum().item() / total_tokens,
            judge_failures=rollout.stat("judge_failures").sum().item(),
            judge_transport_failures=rollout.judge_unanswered,
            reviews=rollout.stat("reviews").sum().item(),
            reward_control=torch.nanmean(rewards[rollout.is_control]).item(),
            reward_intervened=torch.nanmean(rewards[intervened]).item() if intervened.any() else None,
            length_control=rollout.stat("completion_tokens")[rollout.is_control].mean().nan_to_num().item(),
            clipped_control=rollout.stat("truncated")[rollout.is_control].mean().nan_to_num().item(),
            length_revised=rollout.stat("completion_tokens")[revised].mean().item() if revised.any() else None,
            reward_revised=torch.nanmean(rewards[revised]).item() if revised.any() else None,
        )

    @property
    def judge_parse_failures(self) -> float:
        """Judge answers that came back unusable (unparseable, out of range, cut by their token budget)."""
        return self.judge_failures - self.judge_transport_failures


def rollout_metrics(
    rollout: RolloutBatch, measured: RolloutMeasures, args, intervention_share: float | None = None
) -> dict[str, float | tuple[float, float]]:
    """A batch's `mintrl/*` rollout metrics: a float for a gauge, `(numerator, denominator)` for a rate (a logger
    that keeps them as pairs reduces a window as sum over sum; one value is `numerator / max(denominator, 1)`).
    `args` gives `judge_votes` and `judge_token_target`; `intervention_share`: the budget controller's setting of
    this batch, None when it is not logged."""
    stats = {name: rollout.stat(name) for name in rollout.STAT_COLUMNS}
    intervened = stats["intervened"].bool()
    n_intervened = intervened.sum().item()
    n_control = rollout.is_control.sum().item()
    revised = stats["revised"].bool()
    metrics: dict[str, float | tuple[float, float]] = {
        "mintrl/interventions_active": float(rollout.intervening),
        "mintrl/intervention_rate": (revised[intervened].sum().item(), n_intervened),
        "mintrl/reviews_per_rollout": (stats["reviews"][intervened].sum().item(), n_intervened),
        "mintrl/judge_token_frac": (stats["judge_tokens"].sum().item(), stats["completion_tokens"].sum().item()),
        # every policy and judge token (TRL's completions/mean_length counts the policy's only): judge tokens lengthen
        # the intervened rollouts; a policy that learns to run on lengthens the controls too
        "mintrl/length": (stats["completion_tokens"].sum().item(), float(len(rollout.is_control))),
        "mintrl/length_control": (stats["completion_tokens"][rollout.is_control].sum().item(), n_control),
        # rollouts cut at max_completion_length, per half: a control share climbing toward 1 is a run growing to the cap
        "mintrl/clipped_ratio_control": (stats["truncated"][rollout.is_control].sum().item(), n_control),
        "mintrl/judge_failures": measured.judge_failures,
        "mintrl/judge_transport_failures": measured.judge_transport_failures,
        "mintrl/judge_parse_failures": measured.judge_parse_failures,
    }
    if args.judge_votes > 1 and rollout.intervening:
        usable = stats["votes_usable"].sum().item()
        if usable > 0:  # share of the usable review votes that back the decision taken on their chunk
            metrics["mintrl/vote_agreement"] = (stats["votes_agreeing"].sum().item(), usable)
        metrics["mintrl/vetoed_revisions"] = stats["vetoed"].sum().item()
    if intervention_share is not None:
        metrics["mintrl/judge_token_target"] = args.judge_token_target
        metrics["mintrl/intervention_share"] = intervention_share
    if n_intervened > 0:
        metrics["mintrl/length_intervened"] = (stats["completion_tokens"][intervened].sum().item(), n_intervened)
        metrics["mintrl/clipped_ratio_intervened"] = (stats["truncated"][intervened].sum().item(), n_intervened)
    if revised.any():  # what the policy wrote on its own after the last correction, rewarded with the rollout
        metrics["mintrl/policy_tokens_after_correction"] = (
            stats["policy_tokens_after_judge"][revised].sum().item(),
            revised.sum().item(),
        )
        if args.end_at_judge_answer:  # revised rollouts a correction writing the final answer ended
            metrics["mintrl/ended_at_judge_answer"] = (stats["ended_by_judge"].sum().item(), revised.sum().item())
    asked = stats["speculative_chunks"].sum().item()
    if asked > 0:  # the continuous schedule's speculative next chunks (`speculative_chunks`): how many paid off
        metrics["mintrl/speculative_chunks"] = (asked, n_intervened)
        metrics["mintrl/speculative_kept_frac"] = (stats["speculative_kept"].sum().item(), asked)
    if rollout.prefix_cache_hit_rate is not None:  # engines with a cache (vLLM, transformers)
        metrics["mintrl/prefix_cache_hit_rate"] = rollout.prefix_cache_hit_rate
    metrics["mintrl/reward_control"] = measured.reward_control
    if measured.reward_intervened is not None:
        metrics["mintrl/reward_intervened"] = measured.reward_intervened
        metrics["mintrl/reward_gap"] = measured.reward_intervened - measured.reward_control
    return metrics
