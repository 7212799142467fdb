"""`MInTRLTrainer`: GRPOTrainer with judge interventions during rollout and advantage regression (SPEC 2).

The trainer only wires TRL's seams:
- `rollout_func` runs `InterventionRollout` or `ContinuousRollout` (`rollout_schedule`; controls and intervened
  rollouts in one batch) and hands back token ids, sampling log-probs and `env_mask` (0 on judge tokens, TRL's
  `tool_mask`);
- `_score_batch` (after TRL's `_generate_and_score_completions`) replaces TRL's group-normalised advantages by
  `r - mean(control rewards)`;
- `_compute_loss` is the sequence-level advantage regression over all completion tokens, judge tokens included;
  rows that `mask_truncated_completions` masks leave it, normalised over the generation batch as TRL's own loss is.
`rollout_func` hands its per-row roles and statistics to the advantage code as one `RolloutBatch`, in the batch's
`GenerationBatch` record (`trainer_base.py`); `_score_batch` steps the schedule's controllers from it, then logs.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, fields

import torch
from trl import GRPOTrainer

from ..judges import Judge, TransportStatus
from ..losses import advantage_regression_loss, control_baseline_advantages, mintrl_anchors
from ..model_card import ModelCardMixin
from ..text import question_text
from ..trainer_base import GRPOTrainerBase, check_reference_column, default_output_dir
from .absorption import AbsorptionTracker
from .budget import BudgetState, next_intervention_share, reviewed_slot_count, reviewed_slots
from .config import MInTRLConfig
from .judge_factory import (
    JudgeFailureWarning,
    JudgeOutage,
    RaisesOnJudgeOutage,
    build_judge,
    check_judge_backend,
    check_judge_votes,
)
from .loss_metrics import log_loss_totals
from .rollout import RolloutSettings, Trajectory
from .scheduler import check_rollout_schedule, rollout_for

STATE_FILE = "mintrl_state.json"


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
    )

    intervening: bool  # interventions were on for this batch
    is_control: torch.Tensor  # (rows,) bool: purely on-policy rollouts, whose mean reward is the baseline
    stats: torch.Tensor  # (rows, len(STAT_COLUMNS)) float per-rollout statistics
    prefix_cache_hit_rate: float | None  # engines with a prefix cache (vLLM); None otherwise
    judge_requests: float = 0.0  # requests sent to the judge's server (0 for in-process judges)
    judge_unanswered: float = 0.0  # ... of which got no answer (connection refused, timeout, HTTP error)
    judge_last_error: str | None = None  # why this process's latest unanswered request got none (not gathered)

    @classmethod
    def from_trajectories(
        cls,
        trajectories: list[Trajectory],
        intervening: bool,
        is_control: torch.Tensor,
        prefix_cache_hit_rate: float | None,
        transport_before: TransportStatus,
        transport_after: TransportStatus,
    ) -> RolloutBatch:
        """The batch of a finished rollout; the judge's transport counts are the difference of its statuses read
        before and after the rollout."""
        stats = [
            [
                t.review_budget > 0,
                t.revisions > 0,
                t.reviews,
                t.judge_tokens,
                len(t.completion_ids),
                t.judge_failures,
                t.votes_usable,
                t.votes_agreeing,
                t.vetoed,
                t.speculative_chunks,
                t.speculative_kept,
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
        )

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


@dataclass(frozen=True)
class RolloutMeasures:
    """The numbers of one gathered batch that both the metrics and the schedule's controllers read."""

    judge_token_share: float  # judge tokens / completion tokens
    judge_failures: float  # failed judge requests: judge_transport_failures + judge_parse_failures
    judge_transport_failures: float  # requests that got no answer (connection refused, timeout, HTTP error)
    reviews: float  # reviews made (each is `judge_votes` judge calls)
    reward_control: float  # mean reward of the controls
    reward_intervened: float | None  # mean reward of the intervened rollouts; None when there are none

    @classmethod
    def of(cls, rewards: torch.Tensor, rollout: RolloutBatch) -> RolloutMeasures:
        intervened = rollout.stat("intervened").bool()
        total_tokens = max(rollout.stat("completion_tokens").sum().item(), 1.0)
        return cls(
            judge_token_share=rollout.stat("judge_tokens").sum().item() / total_tokens,
            judge_failures=rollout.stat("judge_failures").sum().item(),
            judge_transport_failures=rollout.judge_unanswered,
            reviews=rollout.stat("reviews").sum().item(),
            reward_control=torch.nanmean(rewards[rollout.is_control]).item(),
            reward_intervened=torch.nanmean(rewards[intervened]).item() if intervened.any() else None,
        )

    @property
    def judge_parse_failures(self) -> float:
        """Judge answers that came back unusable (unparseable, out of range, cut by their token budget)."""
        return self.judge_failures - self.judge_transport_failures


class InterventionSchedule:
    """The intervention schedule and the judge's watch, stepped once per training batch with the batch's measures
    over all processes: the budget controller, the judge-failure count, warning and outage watch, and the adaptive
    switch-off. Shared by `MInTRLTrainer` and the asynchronous rollout worker (`async_/worker.py`), whose batches
    are scored steps before they train. The host has `args` and `judge`, calls `_init_schedule`, and says which
    optimizer step the batch being scored trains at (`_schedule_step`)."""

    def _init_schedule(self, args, main_process: bool = True) -> None:
        self.judge_failure_warning = JudgeFailureWarning(args, enabled=main_process)
        self.judge_outage = JudgeOutage(args, main_process=main_process)
        self.judge_failures_total = 0
        self.reward_gap_ema: float | None = None  # adaptive switch-off state (saved with checkpoints)
        self.interventions_stopped_at: int | None = None
        # judge_token_target's controller state (saved with checkpoints); None when the controller is off
        self.intervention_budget = BudgetState() if args.judge_token_target is not None else None

    def _schedule_step(self) -> int:
        """The optimizer step the batch being scored trains at."""
        raise NotImplementedError

    def _interventions_scheduled(self, step: int) -> bool:
        """Whether the batch of optimizer step `step` intervenes: in the first `intervention_steps` steps and, with
        `intervention_stop_gap`, only until corrections stop paying off."""
        return self.judge is not None and step < self.args.intervention_steps and self.interventions_stopped_at is None

    def _step_schedule(self, rollout: RolloutBatch, measured: RolloutMeasures) -> None:
        """After a training batch: the judge-failure count and warning, the outage watch, one budget-controller step
        and the adaptive switch-off. `rollout` and `measured` are over the global rows (the judge's last error aside,
        which only words the log lines): every process takes the same decision."""
        if self.intervention_budget is not None and rollout.intervening:
            self._update_intervention_budget(measured.judge_token_share)
        self.judge_failures_total += int(measured.judge_failures)
        self.judge_failure_warning.update(
            measured.reviews * self.args.judge_votes,
            measured.judge_parse_failures,
            measured.judge_transport_failures,
            rollout.judge_last_error,
        )
        self.judge_outage.update(rollout.judge_requests, rollout.judge_unanswered, rollout.judge_last_error)
        if measured.reward_intervened is not None:
            self._update_adaptive_schedule(measured.reward_intervened - measured.reward_control)

    def _update_adaptive_schedule(self, reward_gap: float) -> None:
        """Moving average of the intervened-vs-control reward gap; below `intervention_stop_gap`, stop for good.
        The gap comes from gathered rewards, so every process takes the same decision."""
        if self.args.intervention_stop_gap is None or math.isnan(reward_gap):
            return
        decay = self.args.intervention_gap_ema
        ema = reward_gap if self.reward_gap_ema is None else decay * self.reward_gap_ema + (1 - decay) * reward_gap
        self.reward_gap_ema = ema
        if ema < self.args.intervention_stop_gap:
            self.interventions_stopped_at = self._schedule_step()

    def _update_intervention_budget(self, judge_token_share: float) -> None:
        """One controller step from the share measured over the gathered batch (the same on every process)."""
        budget = self.intervention_budget
        budget.share = next_intervention_share(budget.share, judge_token_share, self.args.judge_token_target)

    def _schedule_state(self) -> dict:
        """The schedule's part of a checkpoint."""
        state = {
            "judge_failures_total": self.judge_failures_total,
            "reward_gap_ema": self.reward_gap_ema,
            "interventions_stopped_at": self.interventions_stopped_at,
            "judge_outage_steps": self.judge_outage.failed_steps,
        }
        if self.intervention_budget is not None:
            state["intervention_budget"] = self.intervention_budget.to_dict()
        return state

    def _load_schedule_state(self, state: dict) -> None:
        self.judge_failures_total = int(state["judge_failures_total"])
        self.reward_gap_ema = None if state["reward_gap_ema"] is None else float(state["reward_gap_ema"])
        stopped = state["interventions_stopped_at"]
        self.interventions_stopped_at = None if stopped is None else int(stopped)
        if self.intervention_budget is not None:
            self.intervention_budget = BudgetState.from_dict(state["intervention_budget"])
        self.judge_outage.failed_steps = int(state.get("judge_outage_steps", 0))  # added later: older checkpoints


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


class MInTRLTrainer(ModelCardMixin, RaisesOnJudgeOutage, InterventionSchedule, GRPOTrainerBase):
    """Minimal-Intervention RL. Used exactly like `GRPOTrainer`, plus an optional `judge` object (e.g. a
    `FunctionJudge`) that overrides `args.judge`."""

    extra_state_file = STATE_FILE
    # added later: older checkpoints start them afresh
    optional_extra_state_keys = frozenset({"judge_absorption", "judge_outage_steps"})
    _tag_names = ["trl", "mintrl"]
    _name = "MInTRL"
    _paper = {
        "title": "MInTRL: Off-policy Intervention can boost On-policy RL",
        "id": None,
        "citation": textwrap.dedent("""\
            @article{chen2026mintrl,
                title        = {{MInTRL: Off-policy Intervention can boost On-policy RL}},
                author       = {Mingyu Chen and Yefan Tao and Gerald Friedland and Xuezhou Zhang and Chris Kong},
                year         = 2026,
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs,
        args: MInTRLConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        judge: Judge | None = None,
        **kwargs,
    ):
        if args is None:
            args = MInTRLConfig(default_output_dir(model, "MInTRL"))
        if not isinstance(args, MInTRLConfig):
            raise TypeError(f"MInTRLTrainer needs args=MInTRLConfig(...), got {type(args).__name__}.")
        check_mintrl_inputs(args, model, train_dataset, peft_config, judge, kwargs)
        super().__init__(
            model,
            reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            **kwargs,
        )
        self.rollout_func = self._intervention_rollout
        self.judge = judge if judge is not None else build_judge(args, self)
        self._init_schedule(args, main_process=self.accelerator.is_main_process)
        self.add_callback(self.judge_outage)  # saves and stops after the step in which "stop" decides
        self.absorption = AbsorptionTracker(args.absorption_window, args.absorption_max_nll, args.absorption_min_fall)

    def _judge_outage_stop_reason(self) -> str | None:
        return self.judge_outage.stop_reason

    # ----- schedule -----
    def interventions_active(self) -> bool:
        """Interventions run for the first `intervention_steps` optimizer steps of training (and, with
        `intervention_stop_gap`, only until corrections stop paying off); never in evaluation."""
        return self.model.training and self._interventions_scheduled(self.state.global_step)

    def _schedule_step(self) -> int:
        return self.state.global_step

    def _reviewed_columns(self, rows: slice, column: torch.Tensor) -> torch.Tensor:
        """(rows,) bool: which of this process's rows are reviewed (`reviewed_rows`). The controller's state is the
        same on every process, so they all pick the same global slots."""
        batch_rows = (rows.stop - rows.start) * self.accelerator.num_processes
        args = self.args
        return reviewed_rows(
            rows, batch_rows, self._group_size(), args.num_control_generations, self.intervention_budget, column.device
        )

    # ----- rollout (TRL's rollout_func seam) -----
    def _intervention_rollout(self, prompts: list, trainer: GRPOTrainer) -> dict:
        args = self.args
        intervening = self.interventions_active()
        rows = self._process_slice(len(prompts))  # this process's global rows: a row's role is its group column
        column = torch.arange(rows.start, rows.stop, device=self.accelerator.device) % self._group_size()
        is_control = ~self._reviewed_columns(rows, column) if intervening else torch.ones_like(column, dtype=bool)
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        trajectories = [
            Trajectory(
                prompt_ids=list(ids),
                question=question_text(prompt),
                reference=row.get(args.reference_column),
                review_budget=0 if control else args.max_reviews,
            )
            for prompt, ids, row, control in zip(
                prompts, prompt_ids, self._batch.inputs, is_control.tolist(), strict=True
            )
        ]
        # the rollout's settings are config fields of the same names
        settings = RolloutSettings(**{f.name: getattr(args, f.name) for f in fields(RolloutSettings)})
        self.policy_engine.reset_cache_stats()
        transport_before = self._judge_transport()
        rollout = rollout_for(
            self.policy_engine, self.judge, self.processing_class, settings, args.rollout_schedule,
            speculate=args.speculative_chunks,
        )  # fmt: skip
        rollout.run(trajectories)
        self._batch.rollout = RolloutBatch.from_trajectories(
            trajectories,
            intervening,
            is_control,
            self.policy_engine.prefix_cache_hit_rate(),
            transport_before,
            self._judge_transport(),
        )
        logprobs = [t.logprobs for t in trajectories]
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": None if any(lp is None for lp in logprobs) else logprobs,
            "env_mask": [t.env_mask for t in trajectories],
            # extra per-row field: reaches reward functions as the `mintrl_intervened` keyword
            "mintrl_intervened": [t.review_budget > 0 for t in trajectories],
        }

    def _judge_transport(self) -> TransportStatus:
        return TransportStatus() if self.judge is None else self.judge.transport_status()

    # ----- advantages -----
    def _score_batch(self, output: dict, batch) -> None:
        rollout = batch.rollout.gathered(self.accelerator)
        rewards = batch.rewards(self.reward_weights)
        advantages = control_baseline_advantages(rewards, rollout.is_control, self._group_size())
        output["advantages"] = advantages[self._process_slice(len(batch.inputs))]
        # rows in the regression over the whole generation batch and every process, as TRL's `num_items_in_batch`
        # counts tokens: a row masked by `mask_truncated_completions` has no completion token left
        output["num_regression_rows"] = self.accelerator.gather(output["completion_mask"].any(dim=1).sum()).sum()
        measured = RolloutMeasures.of(rewards, rollout)
        self._log_rollout_metrics(rollout, measured)
        if self._mode() == "train":
            self._step_schedule(rollout, measured)

    def _log_rollout_metrics(self, rollout: RolloutBatch, measured: RolloutMeasures) -> None:
        """`rollout` and `measured` are over the global rows: every process logs the same numbers."""
        mode = self._mode()
        budget = self.intervention_budget
        # the controller's setting of this batch, logged while it acts on training batches
        share = budget.share if budget is not None and rollout.intervening and mode == "train" else None
        metrics = self._metrics[mode]
        for key, value in rollout_metrics(rollout, measured, self.args, share).items():
            metrics[key].append(value[0] / max(value[1], 1.0) if isinstance(value, tuple) else value)

    # ----- loss -----
    def _compute_loss(self, model, inputs):
        mode = self._mode()
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([prompt_mask, completion_mask], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
        )
        mask = completion_mask.to(per_token_logps.dtype)
        policy_tokens = inputs.get("tool_mask", torch.ones_like(completion_mask)).bool()
        judge_tokens = ~policy_tokens & completion_mask.bool()
        # pi_old: the policy that sampled the batch. TRL only computes old log-probs when a generation batch serves
        # several optimizer steps; otherwise pi_old == pi_theta at this forward and the detached log-probs are exact.
        old_logps = inputs.get("old_per_token_logps")
        anchors = mintrl_anchors(
            per_token_logps if old_logps is None else old_logps, judge_tokens, self.args.anchor, self.args.kappa
        )
        in_regression = completion_mask.bool().any(dim=1)  # False on rows masked by mask_truncated_completions
        loss, residuals = advantage_regression_loss(
            per_token_logps,
            anchors,
            mask,
            inputs["advantages"],
            self.args.regression_beta,
            in_regression,
            self._regression_rows(inputs, in_regression),
        )

        n_judge = judge_tokens.sum()
        judge_nll = -(per_token_logps.detach() * judge_tokens).sum()
        squared_residuals = torch.where(in_regression, residuals.detach().pow(2), 0.0).sum()
        totals = self.accelerator.reduce(
            torch.stack(
                [
                    judge_nll,
                    n_judge.float(),
                    (entropies * mask).sum(),
                    mask.sum(),
                    squared_residuals,
                    in_regression.sum().float(),
                ]
            ),
            reduction="sum",
        )
        log_loss_totals(self, mode, totals)
        return loss

    def _regression_rows(self, inputs: dict, in_regression: torch.Tensor) -> torch.Tensor:
        """What this micro-batch's summed squared residuals are divided by, so that the micro-batches of an
        optimizer step, on every process, add up to the mean over the rows in the regression. As TRL normalises its
        token-level losses by `num_items_in_batch`: the count is over the generation batch and all processes,
        whose gradients are averaged, and is shared by the generation batch's `steps_per_generation` micro-batches,
        `gradient_accumulation_steps` of which make an optimizer step (the Trainer's own accumulation scaling is
        off: `loss_is_scaled_for_ga`). No row in the regression: loss 0."""
        accumulation = self.current_gradient_accumulation_steps if self.model.training else 1
        rows = inputs.get("num_regression_rows")
        if rows is None:  # a batch not built by `_generate_and_score_completions` (e.g. a test's): its own rows
            return in_regression.sum().clamp(min=1) * accumulation
        rows = rows.clamp(min=1) / self.accelerator.num_processes
        if self.model.training:  # in evaluation the batch is neither split nor accumulated
            rows = rows * accumulation / self.args.steps_per_generation
        return rows

    # ----- checkpoint state (written to and read from STATE_FILE by GRPOTrainerBase) -----
    def _extra_state(self) -> dict:
        return {
            "judge": self.judge.state_dict() if self.judge is not None else {},
            "judge_absorption": self.absorption.state_dict(),
            **self._schedule_state(),
        }

    def _load_extra_state(self, state: dict) -> None:
        if self.judge is not None:
            self.judge.load_state_dict(state["judge"])
        self._load_schedule_state(state)
        if "judge_absorption" in state:
            self.absorption.load_state_dict(state["judge_absorption"])


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
    metrics: dict[str, float | tuple[float, float]] = {
        "mintrl/interventions_active": float(rollout.intervening),
        "mintrl/intervention_rate": (stats["revised"][intervened].sum().item(), n_intervened),
        "mintrl/reviews_per_rollout": (stats["reviews"][intervened].sum().item(), n_intervened),
        "mintrl/judge_token_frac": (stats["judge_tokens"].sum().item(), stats["completion_tokens"].sum().item()),
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
    asked = stats["speculative_chunks"].sum().item()
    if asked > 0:  # the continuous schedule's speculative next chunks (`speculative_chunks`): how many paid off
        metrics["mintrl/speculative_chunks"] = (asked, n_intervened)
        metrics["mintrl/speculative_kept_frac"] = (stats["speculative_kept"].sum().item(), asked)
    if rollout.prefix_cache_hit_rate is not None:  # engines with a prefix cache (vLLM)
        metrics["mintrl/prefix_cache_hit_rate"] = rollout.prefix_cache_hit_rate
    metrics["mintrl/reward_control"] = measured.reward_control
    if measured.reward_intervened is not None:
        metrics["mintrl/reward_intervened"] = measured.reward_intervened
        metrics["mintrl/reward_gap"] = measured.reward_intervened - measured.reward_control
    return metrics


def check_mintrl_inputs(args: MInTRLConfig, model, train_dataset, peft_config, judge, trainer_kwargs: dict) -> None:
    """What `MInTRLTrainer` refuses before the model loads: TRL arguments its rollout replaces, a judge object of the
    wrong type, a judge backend or vote setting that cannot work, an unsupported vLLM mode or rollout schedule."""
    if trainer_kwargs.get("rollout_func") is not None:
        raise ValueError("MInTRLTrainer provides its own rollout_func (the intervention loop); do not pass one.")
    for name in ("tools", "environment_factory"):  # TRL's tool loop would overwrite the judge-token mask
        if trainer_kwargs.get(name):
            raise ValueError(
                f"MInTRLTrainer does not take {name}=: its rollout is the judge's intervention loop, which has no "
                "tool-calling loop. Train tool use with GRPOTrainer."
            )
    if judge is not None and not isinstance(judge, Judge):
        raise TypeError(f"judge must be a trl_mintrl.judges.Judge (e.g. FunctionJudge), got {type(judge)}.")
    if judge is None and args.judge in ("self", "base") and args.intervention_steps > 0:
        check_reference_column(train_dataset, args.reference_column, f"judge={args.judge!r}")
    if judge is None:
        check_judge_backend(args, model, peft_config)
    check_judge_votes(args, judge)
    if args.use_vllm:
        from ..engines.vllm import check_vllm_mode_supported

        check_vllm_mode_supported(args)
    check_rollout_schedule(args)
