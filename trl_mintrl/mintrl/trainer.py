"""`MInTRLTrainer`: GRPOTrainer with judge interventions during rollout and advantage regression.

The trainer only wires TRL's seams:
- `rollout_func` runs `InterventionRollout` or `ContinuousRollout` (`rollout_schedule`; controls and intervened
  rollouts in one batch) and hands back token ids, sampling log-probs and `env_mask` (1 on policy tokens only,
  TRL's `tool_mask`);
- with `tools=` / `environment_factory=` the tools run inside that rollout (tools.py says why), and
  `_tool_call_loop`, which TRL runs after any rollout_func, hands back what the rollout recorded instead of running
  the tools again;
- `_score_batch` (after TRL's `_generate_and_score_completions`) replaces TRL's group-normalised advantages by
  `r - mean(control rewards)` and adds the per-row `judge_mask`, the judge tokens' own channel beside `tool_mask`;
- `_compute_loss` is the sequence-level advantage regression over the policy and judge tokens (tool results stay
  out);
  rows that `mask_truncated_completions` masks leave it, normalised over the generation batch as TRL's own loss is.
`rollout_func` hands its per-row roles and statistics to the advantage code as one `RolloutBatch` (rollout_batch.py),
in the batch's `GenerationBatch` record (`trainer_base.py`); `_score_batch` steps the schedule's controllers
(`InterventionSchedule`, intervention_schedule.py) from it, then logs.
"""

from __future__ import annotations

from dataclasses import fields

import torch
from trl import GRPOTrainer

from ..input_checks import check_reference_column
from ..judges import Judge, TransportStatus
from ..losses import (
    advantage_regression_loss,
    control_baseline_advantages,
    mintrl_anchors,
    regression_token_masks,
)
from ..text import question_text
from ..trainer_base import GenerationBatch, GRPOTrainerBase, default_output_dir
from .absorption import AbsorptionTracker
from .config import MInTRLConfig
from .continuous import check_rollout_schedule, rollout_for
from .intervention_schedule import InterventionSchedule, reviewed_rows
from .judge_factory import build_judge, check_judge_backend, check_judge_votes
from .judge_watch import raise_if_judge_stopped
from .loss_metrics import log_loss_totals
from .paper import PAPER
from .rollout import RolloutSettings, Trajectory
from .rollout_batch import RolloutBatch, RolloutMeasures, rollout_metrics
from .tools import TRLToolEnvironment, check_tool_processing_class

STATE_FILE = "mintrl_state.json"


class MInTRLTrainer(GRPOTrainerBase):
    """Minimal-Intervention RL. Used exactly like `GRPOTrainer`, plus an optional `judge` object (e.g. a
    `FunctionJudge`) that overrides `args.judge`."""

    extra_state_file = STATE_FILE
    # added later: older checkpoints start them afresh
    optional_extra_state_keys = frozenset({"judge_absorption", "judge_outage_steps", "regime_watch"})
    _tag_names = ["trl", "mintrl"]
    _name = "MInTRL"
    _paper = PAPER

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
        check_tool_processing_class(self)
        self.rollout_func = self._intervention_rollout
        self.judge = judge if judge is not None else build_judge(args, self)
        self.schedule = InterventionSchedule(args, main_process=self.accelerator.is_main_process)
        self.add_callback(self.schedule.judge_outage)  # saves and stops after the step in which "stop" decides
        self.absorption = AbsorptionTracker(args.absorption_window, args.absorption_max_nll, args.absorption_min_fall)

    def train(self, *args, **kwargs):
        """`GRPOTrainer.train`; raises `JudgeOutageError` when `judge_outage_policy="stop"` ended it, after the
        checkpoint of the step it stopped at was written."""
        output = super().train(*args, **kwargs)
        raise_if_judge_stopped(self.schedule.judge_outage.stop_reason, self._checkpoint_folder(None))
        return output

    # ----- schedule -----
    def interventions_active(self) -> bool:
        """Interventions run for the first `intervention_steps` optimizer steps of training (and, with
        `intervention_stop_gap`, only until corrections stop paying off); never in evaluation."""
        return self.model.training and self.judge is not None and self.schedule.scheduled(self.state.global_step)

    def _reviewed_columns(self, rows: slice, column: torch.Tensor) -> torch.Tensor:
        """(rows,) bool: which of this process's rows are reviewed (`reviewed_rows`). The controller's state is the
        same on every process, so they all pick the same global slots."""
        batch_rows = (rows.stop - rows.start) * self.accelerator.num_processes
        args = self.args
        return reviewed_rows(
            rows,
            batch_rows,
            self.group_size(),
            args.num_control_generations,
            self.schedule.intervention_budget,
            column.device,
        )

    # ----- rollout (TRL's rollout_func seam) -----
    def _intervention_rollout(self, prompts: list, trainer: GRPOTrainer) -> dict:
        args = self.args
        intervening = self.interventions_active()
        rows = self.process_slice(len(prompts))  # this process's global rows: a row's role is its group column
        column = torch.arange(rows.start, rows.stop, device=self.accelerator.device) % self.group_size()
        is_control = ~self._reviewed_columns(rows, column) if intervening else torch.ones_like(column, dtype=bool)
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        trajectories = [
            Trajectory(
                prompt_ids=list(ids),
                question=question_text(prompt),
                reference=self.judge_reference(row),
                review_budget=0 if control else args.max_reviews,
                environment=TRLToolEnvironment(self, i) if self.tools else None,
            )
            for i, (prompt, ids, row, control) in enumerate(
                zip(prompts, prompt_ids, self._batch.inputs, is_control.tolist(), strict=True)
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
            {*self.eos_token_ids, self._tokenizer.pad_token_id},  # as TRL tells a clipped completion
        )
        logprobs = [t.logprobs for t in trajectories]
        output = {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": None if any(lp is None for lp in logprobs) else logprobs,
            # extra per-row field: reaches reward functions as the `mintrl_intervened` keyword
            "mintrl_intervened": [t.review_budget > 0 for t in trajectories],
        }
        if not self.tools:  # with tools, TRL takes its tool_mask from `_tool_call_loop` instead
            output["env_mask"] = [t.env_mask for t in trajectories]
        return output

    def judge_reference(self, row: dict) -> str | None:
        """The reference solution the judge reads for a dataset row (its privileged context): the row's
        `reference_column` value. A subclass whose references are not text (`MInTRLSORTTrainer`'s reference
        conversations) renders them here."""
        return row.get(self.args.reference_column)

    def rollout_groups(self, rows: list[dict]) -> RolloutBatch:
        """One rollout of a group per dataset row (controls and intervened, in TRL's order), exactly as the rollout
        of the first training batch, without rewards, loss or step: for checks before training (`trl-mintrl
        judge-check`). Not with tools, whose per-batch state TRL builds in its own generation step."""
        if self.tools:
            raise ValueError("rollout_groups does not run tools: with tools=, check the judge in a training run.")
        training = self.model.training
        self.model.train()  # interventions run in training mode only
        self._batch = GenerationBatch([row for row in rows for _ in range(self.num_generations)])
        try:
            self._intervention_rollout([row["prompt"] for row in self._batch.inputs], self)
            return self._batch.rollout
        finally:
            self._batch = None
            self.model.train(training)

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        """TRL runs its tool loop after the rollout_func; the tools already ran inside the intervention rollout, so
        this returns, in TRL's order, what it recorded: the policy-token mask (0 on judge and tool-result tokens),
        each rollout's messages (assistant turns and tool results, for the reward functions), the tool calls and
        failures of this process (`tools/*` metrics), and no tool images (refused)."""
        rollout = self._batch.rollout
        return (
            rollout.env_masks,
            rollout.messages,
            completion_ids,
            logprobs,
            int(rollout.stat("tool_calls").sum().item()),
            int(rollout.stat("tool_failures").sum().item()),
            [[] for _ in completion_ids],
        )

    def _judge_transport(self) -> TransportStatus:
        return TransportStatus() if self.judge is None else self.judge.transport_status()

    # ----- advantages -----
    def _score_batch(self, output: dict, batch) -> None:
        # the judge tokens' own channel beside TRL's tool_mask (which is 0 on judge and tool-result tokens alike)
        output["judge_mask"] = batch.rollout.judge_mask(output["completion_ids"].size(1))
        rollout = batch.rollout.gathered(self.accelerator)
        rewards = batch.rewards(self.reward_weights)
        advantages = control_baseline_advantages(rewards, rollout.is_control, self.group_size())
        output["advantages"] = advantages[self.process_slice(len(batch.inputs))]
        # rows in the regression over the whole generation batch and every process, as TRL's `num_items_in_batch`
        # counts tokens: a row masked by `mask_truncated_completions` has no completion token left
        output["num_regression_rows"] = self.accelerator.gather(output["completion_mask"].any(dim=1).sum()).sum()
        measured = RolloutMeasures.of(rewards, rollout)
        self._log_rollout_metrics(rollout, measured)
        if self._mode() == "train":
            self.schedule.step(rollout, measured, self.state.global_step)

    def _log_rollout_metrics(self, rollout: RolloutBatch, measured: RolloutMeasures) -> None:
        """`rollout` and `measured` are over the global rows: every process logs the same numbers."""
        mode = self._mode()
        budget = self.schedule.intervention_budget
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
        regressed, judge_tokens = regression_token_masks(
            completion_mask, inputs.get("tool_mask"), inputs.get("judge_mask")
        )
        mask = regressed.to(per_token_logps.dtype)
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
            **self.schedule.state_dict(),
        }

    def _load_extra_state(self, state: dict) -> None:
        if self.judge is not None:
            self.judge.load_state_dict(state["judge"])
        self.schedule.load_state_dict(state)
        if "judge_absorption" in state:
            self.absorption.load_state_dict(state["judge_absorption"])


def check_mintrl_inputs(args: MInTRLConfig, model, train_dataset, peft_config, judge, trainer_kwargs: dict) -> None:
    """What `MInTRLTrainer` refuses before the model loads: TRL arguments its rollout replaces, a judge object of
    the wrong type, a judge backend or vote setting that cannot work, an
    unsupported vLLM mode or rollout schedule."""
    if trainer_kwargs.get("rollout_func") is not None:
        raise ValueError(
            "MInTRLTrainer provides its own rollout_func (the intervention loop, tool calls included); do not pass one."
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
