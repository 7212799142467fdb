"""The intervention schedule (`InterventionSchedule`) and which rollouts of a batch are reviewed (`reviewed_rows`):
owned by `MInTRLTrainer` and by the asynchronous rollout worker (`async_/worker.py`), and kept out of the trainer's
module so that the worker never imports the synchronous trainer."""

from __future__ import annotations

import math

import torch

from .budget import BudgetState, next_intervention_share, reviewed_slot_count, reviewed_slots
from .judge_watch import JudgeFailureWarning, JudgeOutage
from .regime_watch import RegimeWatch
from .rollout_batch import RolloutBatch, RolloutMeasures


class InterventionSchedule:
    """The intervention schedule and the judge's watch, a part that `MInTRLTrainer` and the asynchronous rollout
    worker (`async_/worker.py`, whose batches are scored steps before they train) each own as `schedule`. Stepped once
    per training batch (`step`) with the batch's measures over all processes: the budget controller, the
    judge-failure count, warning and outage watch, the regime warnings and the adaptive switch-off. Its state goes
    into the host's checkpoints (`state_dict`)."""

    def __init__(self, args, main_process: bool = True):
        self.args = args
        self.judge_failure_warning = JudgeFailureWarning(args, enabled=main_process)
        self.judge_outage = JudgeOutage(args, main_process=main_process)
        self.regime_watch = RegimeWatch(
            args.judge_share_warning,
            args.control_length_warning,
            args.max_completion_length,
            revised_length_ratio=args.revised_length_warning,
            enabled=main_process,
        )
        self.judge_failures_total = 0
        self.reward_gap_ema: float | None = None  # adaptive switch-off state (saved with checkpoints)
        self.interventions_stopped_at: int | None = None
        # judge_token_target's controller state (saved with checkpoints); None when the controller is off
        self.intervention_budget = BudgetState() if args.judge_token_target is not None else None

    def scheduled(self, step: int) -> bool:
        """Whether the batch of optimizer step `step` intervenes (the host also needs a judge): in the first
        `intervention_steps` steps and, with `intervention_stop_gap`, only until corrections stop paying off."""
        return step < self.args.intervention_steps and self.interventions_stopped_at is None

    def step(self, rollout: RolloutBatch, measured: RolloutMeasures, step: int) -> None:
        """After the training batch of optimizer step `step`: the judge-failure count and warning, the outage watch,
        one budget-controller step, the regime warnings (the controls' length also after the interventions end) and
        the adaptive switch-off. `rollout` and `measured` are over the global rows (the judge's last error aside,
        which only words the log lines): every process takes the same decision."""
        if self.intervention_budget is not None and rollout.intervening:
            self._update_intervention_budget(measured.judge_token_share)
        if rollout.intervening:
            gap = None if measured.reward_revised is None else measured.reward_revised - measured.reward_control
            self.regime_watch.update(
                measured.judge_token_share,
                measured.length_control,
                measured.clipped_control,
                revised_length=measured.length_revised,
                revised_reward_gap=gap,
            )
        else:
            self.regime_watch.update_after_interventions(measured.length_control, measured.clipped_control)
        self.judge_failures_total += int(measured.judge_failures)
        self.judge_failure_warning.update(
            measured.reviews * self.args.judge_votes,
            measured.judge_parse_failures,
            measured.judge_transport_failures,
            rollout.judge_last_error,
        )
        self.judge_outage.update(rollout.judge_requests, rollout.judge_unanswered, rollout.judge_last_error)
        if measured.reward_intervened is not None:
            self._update_adaptive_schedule(measured.reward_intervened - measured.reward_control, step)

    def _update_adaptive_schedule(self, reward_gap: float, step: int) -> None:
        """Moving average of the intervened-vs-control reward gap; below `intervention_stop_gap`, stop for good.
        The gap comes from gathered rewards, so every process takes the same decision."""
        if self.args.intervention_stop_gap is None or math.isnan(reward_gap):
            return
        decay = self.args.intervention_gap_ema
        ema = reward_gap if self.reward_gap_ema is None else decay * self.reward_gap_ema + (1 - decay) * reward_gap
        self.reward_gap_ema = ema
        if ema < self.args.intervention_stop_gap:
            self.interventions_stopped_at = step

    def _update_intervention_budget(self, judge_token_share: float) -> None:
        """One controller step from the share measured over the gathered batch (the same on every process)."""
        budget = self.intervention_budget
        target = self.args.judge_token_target
        budget.share = next_intervention_share(budget.share, judge_token_share, target, first=not budget.measured)
        budget.measured = budget.measured or judge_token_share > 0

    def state_dict(self) -> dict:
        """The schedule's part of a checkpoint."""
        state = {
            "judge_failures_total": self.judge_failures_total,
            "reward_gap_ema": self.reward_gap_ema,
            "interventions_stopped_at": self.interventions_stopped_at,
            "judge_outage_steps": self.judge_outage.failed_steps,
            "regime_watch": self.regime_watch.state_dict(),
        }
        if self.intervention_budget is not None:
            state["intervention_budget"] = self.intervention_budget.to_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.judge_failures_total = int(state["judge_failures_total"])
        self.reward_gap_ema = None if state["reward_gap_ema"] is None else float(state["reward_gap_ema"])
        stopped = state["interventions_stopped_at"]
        self.interventions_stopped_at = None if stopped is None else int(stopped)
        if self.intervention_budget is not None:
            self.intervention_budget = BudgetState.from_dict(state["intervention_budget"])
        self.judge_outage.failed_steps = int(state.get("judge_outage_steps", 0))  # added later: older checkpoints
        if "regime_watch" in state:  # added later too
            self.regime_watch.load_state_dict(state["regime_watch"])


def reviewed_rows(
    rows: slice, batch_rows: int, group_size: int, num_controls: int, budget: BudgetState | None, device=None
) -> torch.Tensor:
    """(rows,) bool: which `rows` of a batch of `batch_rows` rollouts (groups of `group_size`, the first
    `num_controls` of each group controls) are reviewed. Every intervened column without the budget controller; with
    it, `reviewed_slot_count` of the batch's intervened slots, spread evenly over the groups (`budget.carry` moves
    on: call it once per batch)."""
    index = torch.arange(rows.start, rows.stop, device=device)
    column = index % group_size
    intervened = column >= num_controls
    if budget is None:
        return intervened
    per_group = group_size - num_controls
    slots = batch_rows // group_size * per_group
    count, budget.carry = reviewed_slot_count(budget.share, slots, budget.carry)
    reviewed = torch.tensor(reviewed_slots(count, slots), device=device)
    slot = (index // group_size * per_group + column - num_controls).clamp(min=0)
    return intervened & reviewed[slot]
