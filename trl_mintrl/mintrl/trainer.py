"""`MInTRLTrainer`: GRPOTrainer with judge interventions during rollout and advantage regression (SPEC 2).

The trainer only wires TRL's seams:
- `rollout_func` runs `InterventionRollout` (controls and intervened rollouts in one batched state machine) and
  hands back token ids, sampling log-probs and `env_mask` (0 on judge tokens, TRL's `tool_mask`);
- `_generate_and_score_completions` replaces TRL's group-normalised advantages by `r - mean(control rewards)`;
- `_compute_loss` is the sequence-level advantage regression over all completion tokens, judge tokens included.
"""

from __future__ import annotations

import json
import math
import os
import textwrap

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from ..engines import engine_for_trainer
from ..grpo_hooks import BatchCaptureMixin
from ..judges import Judge
from ..losses import control_baseline_advantages, regression_residuals
from ..model_card import ModelCardMixin
from ..prompts import question_text
from .config import MInTRLConfig
from .judge_factory import JudgeFailureWarning, build_judge, check_judge_backend
from .rollout import InterventionRollout, RolloutSettings, Trajectory

STATE_FILE = "mintrl_state.json"

# per-rollout statistics gathered across processes: column order of `_rollout_stats`
_STAT_COLUMNS = ("intervened", "revised", "reviews", "judge_tokens", "completion_tokens", "judge_failures")


class MInTRLTrainer(ModelCardMixin, BatchCaptureMixin, GRPOTrainer):
    """Minimal-Intervention RL. Used exactly like `GRPOTrainer`, plus an optional `judge` object (e.g. a
    `FunctionJudge`) that overrides `args.judge`."""

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
            name = model if isinstance(model, str) else model.config._name_or_path
            args = MInTRLConfig(f"{name.split('/')[-1]}-MInTRL")
        if not isinstance(args, MInTRLConfig):
            raise TypeError(f"MInTRLTrainer needs args=MInTRLConfig(...), got {type(args).__name__}.")
        if kwargs.get("rollout_func") is not None:
            raise ValueError("MInTRLTrainer provides its own rollout_func (the intervention loop); do not pass one.")
        if judge is not None and not isinstance(judge, Judge):
            raise TypeError(f"judge must be a trl_mintrl.judges.Judge (e.g. FunctionJudge), got {type(judge)}.")
        if judge is None and args.judge in ("self", "base") and args.intervention_steps > 0:
            _require_column(train_dataset, args.reference_column)
        if judge is None:
            check_judge_backend(args, model, peft_config)
        if not args.ds3_gather_for_generation:
            raise ValueError(
                "ds3_gather_for_generation=False is not supported by MInTRL: ranks run different numbers of rollout "
                "rounds, which needs the gathered weights. Set ds3_gather_for_generation=True."
            )
        if args.use_vllm:
            from ..engines.vllm import check_vllm_mode_supported

            check_vllm_mode_supported(args)
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
        self.policy_engine = engine_for_trainer(self)
        self.judge = judge if judge is not None else build_judge(args, self)
        self.judge_failure_warning = JudgeFailureWarning(args, enabled=self.accelerator.is_main_process)
        self._intervening = False
        self._rollout_stats: torch.Tensor | None = None
        self._prefix_cache_hit_rate: float | None = None
        self.judge_failures_total = 0
        self.reward_gap_ema: float | None = None  # adaptive switch-off state (saved with checkpoints)
        self.interventions_stopped_at: int | None = None

    # ----- schedule -----
    def interventions_active(self) -> bool:
        """Interventions run for the first `intervention_steps` optimizer steps of training (and, with
        `intervention_stop_gap`, only until corrections stop paying off); never in evaluation."""
        return (
            self.model.training
            and self.judge is not None
            and self.state.global_step < self.args.intervention_steps
            and self.interventions_stopped_at is None
        )

    def _update_adaptive_schedule(self, reward_gap: float) -> None:
        """Moving average of the intervened-vs-control reward gap; below `intervention_stop_gap`, stop for good.
        The gap comes from gathered rewards, so every process takes the same decision."""
        if self.args.intervention_stop_gap is None or math.isnan(reward_gap):
            return
        decay = self.args.intervention_gap_ema
        ema = reward_gap if self.reward_gap_ema is None else decay * self.reward_gap_ema + (1 - decay) * reward_gap
        self.reward_gap_ema = ema
        if ema < self.args.intervention_stop_gap:
            self.interventions_stopped_at = self.state.global_step

    # ----- rollout (TRL's rollout_func seam) -----
    def _intervention_rollout(self, prompts: list, trainer: GRPOTrainer) -> dict:
        args = self.args
        self._intervening = self.interventions_active()
        group = self.num_generations if self.model.training else self.num_generations_eval
        first_row = self.accelerator.process_index * len(prompts)  # global row index of this process's first row
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        trajectories = []
        for i, (prompt, ids, row) in enumerate(zip(prompts, prompt_ids, self._batch_inputs, strict=True)):
            intervened = self._intervening and (first_row + i) % group >= args.num_control_generations
            trajectories.append(
                Trajectory(
                    prompt_ids=list(ids),
                    question=question_text(prompt),
                    reference=row.get(args.reference_column),
                    review_budget=args.max_reviews if intervened else 0,
                )
            )
        settings = RolloutSettings(
            chunk_size=args.chunk_size,
            max_reviews=args.max_reviews,
            max_correction_tokens=args.max_correction_tokens,
            max_completion_length=args.max_completion_length,
        )
        self.policy_engine.reset_cache_stats()
        InterventionRollout(self.policy_engine, self.judge, self.processing_class, settings).run(trajectories)
        self._prefix_cache_hit_rate = self.policy_engine.prefix_cache_hit_rate()
        self._rollout_stats = torch.tensor(
            [
                [t.review_budget > 0, t.revisions > 0, t.reviews, t.judge_tokens, len(t.completion_ids), t.judge_failures]
                for t in trajectories
            ],
            dtype=torch.float32,
            device=self.accelerator.device,
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

    # ----- advantages -----
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        group = self.num_generations if self.model.training else self.num_generations_eval
        rewards = self._batch_rewards()
        column = torch.arange(rewards.numel(), device=rewards.device) % group
        is_control = column < self.args.num_control_generations if self._intervening else torch.ones_like(column).bool()
        advantages = control_baseline_advantages(rewards, is_control, group)
        output["advantages"] = advantages[self._process_slice(len(inputs))]
        self._log_rollout_metrics(rewards, is_control)
        return output

    def _log_rollout_metrics(self, rewards: torch.Tensor, is_control: torch.Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        stats = dict(zip(_STAT_COLUMNS, self.accelerator.gather(self._rollout_stats).T, strict=True))
        intervened = stats["intervened"].bool()
        n_intervened = max(int(intervened.sum()), 1)
        metrics = self._metrics[mode]
        metrics["mintrl/interventions_active"].append(float(self._intervening))
        metrics["mintrl/intervention_rate"].append(stats["revised"][intervened].sum().item() / n_intervened)
        metrics["mintrl/reviews_per_rollout"].append(stats["reviews"][intervened].sum().item() / n_intervened)
        total_tokens = max(stats["completion_tokens"].sum().item(), 1.0)
        metrics["mintrl/judge_token_frac"].append(stats["judge_tokens"].sum().item() / total_tokens)
        failures = stats["judge_failures"].sum().item()
        metrics["mintrl/judge_failures"].append(failures)
        if self._prefix_cache_hit_rate is not None:  # engines with a prefix cache (vLLM)
            rate = torch.tensor([self._prefix_cache_hit_rate], device=self.accelerator.device)
            metrics["mintrl/prefix_cache_hit_rate"].append(self.accelerator.gather(rate).mean().item())
        if mode == "train":
            self.judge_failures_total += int(failures)
            self.judge_failure_warning.update(stats["reviews"].sum().item(), failures)
        reward_control = torch.nanmean(rewards[is_control]).item()
        metrics["mintrl/reward_control"].append(reward_control)
        if intervened.any():
            reward_intervened = torch.nanmean(rewards[intervened]).item()
            metrics["mintrl/reward_intervened"].append(reward_intervened)
            metrics["mintrl/reward_gap"].append(reward_intervened - reward_control)
            if mode == "train":
                self._update_adaptive_schedule(reward_intervened - reward_control)

    # ----- loss -----
    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
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
        anchors = (per_token_logps if old_logps is None else old_logps).detach()
        if self.args.anchor == "const":
            anchors = torch.where(judge_tokens, torch.full_like(anchors, self.args.kappa), anchors)
        residuals = regression_residuals(
            per_token_logps, anchors, mask, inputs["advantages"], self.args.regression_beta
        )
        loss = residuals.pow(2).mean()
        if mode == "train":
            loss = loss / self.current_gradient_accumulation_steps  # TRL turns off the Trainer's GA scaling

        metrics = self._metrics[mode]
        n_judge = judge_tokens.sum()
        judge_nll = -(per_token_logps.detach() * judge_tokens).sum()
        totals = self.accelerator.reduce(
            torch.stack([judge_nll, n_judge.float(), (entropies * mask).sum(), mask.sum()]), reduction="sum"
        )
        if totals[1] > 0:
            metrics["mintrl/judge_token_nll"].append((totals[0] / totals[1]).item())
        metrics["entropy"].append((totals[2] / totals[3].clamp(min=1.0)).item())
        residual_rms = self.accelerator.gather(residuals.detach().pow(2).mean()).mean().sqrt()
        metrics["mintrl/regression_residual"].append(residual_rms.item())
        return loss

    # ----- checkpoint state -----
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            state = {
                "judge": self.judge.state_dict() if self.judge is not None else {},
                "judge_failures_total": self.judge_failures_total,
                "reward_gap_ema": self.reward_gap_ema,
                "interventions_stopped_at": self.interventions_stopped_at,
            }
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump(state, f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, STATE_FILE) if checkpoint is not None else None
        if path is not None and os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
            if self.judge is not None:
                self.judge.load_state_dict(state["judge"])
            self.judge_failures_total = state["judge_failures_total"]
            self.reward_gap_ema = state["reward_gap_ema"]
            self.interventions_stopped_at = state["interventions_stopped_at"]


def _require_column(dataset, column: str) -> None:
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None:
        return
    if isinstance(columns, dict):  # DatasetDict
        columns = next(iter(columns.values()))
    if column not in columns:
        raise ValueError(
            f"judge='self' shows the judge the reference solution from column {column!r}, which the train dataset "
            f"lacks (columns: {columns}). Set reference_column to the right column, or pass a judge object."
        )

