"""`MInTRLConfig`: GRPOConfig plus the intervention, judge and regression settings of MInTRL (SPEC 2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..judges.templates import resolve_template
from ..losses import ANCHORS as ANCHOR_VARIANTS
from ..text import NO_THINKING, chat_template_kwargs_field

ANCHORS = tuple(ANCHOR_VARIANTS)  # the variant table in losses.py
JUDGE_BACKENDS = ("self", "base", "model", "endpoint")
ROLLOUT_SCHEDULES = ("auto", "continuous", "barrier")


@dataclass
class MInTRLConfig(GRPOConfig):
    r"""
    Configuration class for the [`MInTRLTrainer`] (Minimal-Intervention RL).

    All [`~trl.GRPOConfig`] parameters apply; the ones below are MInTRL's own. Defaults follow the paper (Table 6)
    where it gives a value.

    Parameters:
        > Parameters that control the group of rollouts

        num_control_generations (`int`, *optional*, defaults to `8`):
            On-policy control rollouts per prompt. Their mean reward is the baseline V(x).
        num_intervened_generations (`int`, *optional*, defaults to `8`):
            Rollouts per prompt that the judge reviews and corrects during the intervention phase.
        num_generations (`int` or `None`, *optional*, defaults to `None`):
            Rollouts per prompt; derived as `num_control_generations + num_intervened_generations`. Leave it unset
            or set it to that sum.

        > Parameters that control the rollout loop

        chunk_size (`int`, *optional*, defaults to `512`):
            Policy tokens generated between two reviews (paper: 512 math, 128 code).
        max_reviews (`int`, *optional*, defaults to `4`):
            Reviews per intervened rollout; afterwards the rest is generated unreviewed.
        max_correction_tokens (`int`, *optional*, defaults to `64`):
            Cap on a judge correction, in policy tokens.
        intervention_steps (`int`, *optional*, defaults to `200`):
            Optimizer steps with interventions (paper: 200 of 500); afterwards every rollout is an on-policy control.
            `0` never intervenes.
        intervention_stop_gap (`float` or `None`, *optional*, defaults to `None`):
            Adaptive switch-off (the paper's suggested improvement): stop intervening for good once the moving
            average of `reward_intervened - reward_control` falls below this value, i.e. once corrections no longer
            help. `None` keeps the fixed `intervention_steps` schedule only.
        intervention_gap_ema (`float`, *optional*, defaults to `0.9`):
            Smoothing of the reward-gap moving average used by `intervention_stop_gap`.
        judge_token_target (`float` or `None`, *optional*, defaults to `None`):
            Intervention budget controller: hold the share of judge tokens among all completion tokens near this
            value (e.g. `0.03`; the paper's sweet spot is 2-4%) by reviewing only a share of the intervened slots
            each step (the others run as controls), raised or lowered from the last step's measured share.
            Combine with `intervention_stop_gap` to also stop when corrections stop helping. `None`: every
            intervened slot is reviewed. Measured on the toy support-expansion benchmark: no resolved gain (docs).

        > Parameters that control voting judges

        judge_votes (`int`, *optional*, defaults to `1`):
            Reviews per chunk, requested together in the same judge call (k copies of each review request) and
            sampled at `judge_temperature`, which must then be > 0 for a model judge.
        judge_min_agree (`int`, *optional*, defaults to `1`):
            Revise a chunk only when at least this many of its `judge_votes` reviews flag a step at or before step
            i; the cut is at the smallest such i. Failed reviews abstain. Measured on the toy support-expansion
            benchmark: no resolved gain (docs).

        > Parameters that control the loss

        anchor (`str`, *optional*, defaults to `"const"`):
            Anchor `a_t` of judge tokens in the regression: `"const"` uses `kappa`, `"proxy"` the old policy's
            log-prob. Policy tokens are always anchored by the old log-prob.
        kappa (`float`, *optional*, defaults to `-0.2`):
            Constant anchor for judge tokens with `anchor="const"` (paper: -0.2 math, -0.1 code).
        regression_beta (`float`, *optional*, defaults to `1e-3`):
            Scale of the summed log-ratio in the advantage regression (the paper's beta2).
        beta (`float`, *optional*, defaults to `0.0`):
            KL coefficient of GRPO. MInTRL's regression has no KL term: it must stay `0.0`.
        vllm_importance_sampling_correction (`bool`, *optional*, defaults to `False`):
            MInTRL uses no importance sampling: the regression target holds for any trajectory.

        > Parameters that control the judge

        judge (`str`, *optional*, defaults to `"self"`):
            Judge backend: `"self"` (the current policy with the reference solution as privileged context),
            `"base"` (the initial weights with the same context, as in the paper's self-intervention ablation: the
            policy with its PEFT adapter disabled, or else a frozen copy loaded from the policy's path), `"model"` (a
            second model from `judge_model_name_or_path`), `"endpoint"` (an OpenAI-compatible server at
            `judge_base_url`). Ignored when a judge object is passed to the trainer.
        judge_model_name_or_path (`str` or `None`, *optional*, defaults to `None`):
            Judge model (local path or Hub id) for `judge="model"`.
        judge_chat_template_kwargs (`dict`, *optional*, defaults to `{"enable_thinking": False}`):
            Chat-template arguments for the judge's prompts (`judge="self"`, `"base"`, `"model"`, on either engine).
            The default turns thinking off: a thinking template (Qwen3) otherwise spends the review budget inside
            `<think>`, the review is cut off and counted as a failure, and the judge never intervenes. Templates that
            do not use a variable ignore it; `{}` renders the template's defaults. The endpoint judge renders on its
            server and does not use this field.
        judge_vllm_gpu_memory_utilization (`float` or `None`, *optional*, defaults to `None`):
            With `judge="model"` (or `"base"` without PEFT) and `use_vllm`: run the judge in a second colocated vLLM
            engine with this share of GPU memory (lower the policy's `vllm_gpu_memory_utilization` to fit both).
            `None` generates the judge with transformers.
        judge_base_url (`str` or `None`, *optional*, defaults to `None`):
            OpenAI-compatible base URL for `judge="endpoint"`, e.g. `http://127.0.0.1:8000/v1`.
        judge_model (`str` or `None`, *optional*, defaults to `None`):
            Model name sent to the endpoint judge.
        judge_api_key_env (`str`, *optional*, defaults to `"OPENAI_API_KEY"`):
            Environment variable holding the endpoint judge's API key.
        judge_timeout_s (`float`, *optional*, defaults to `60.0`):
            Timeout of one endpoint judge request.
        judge_max_retries (`int`, *optional*, defaults to `3`):
            Retries of a failed endpoint judge request.
        judge_max_concurrency (`int`, *optional*, defaults to `16`):
            Concurrent endpoint judge requests.
        judge_temperature (`float`, *optional*, defaults to `0.0`):
            Judge sampling temperature (`0.0`: greedy).
        judge_max_review_tokens (`int`, *optional*, defaults to `256`):
            Token budget of a judge review answer (reasoning + verdict line). A review cut by it fails.
        judge_review_template (`str`, *optional*, defaults to `"math"`):
            Review prompt: a preset name (`"math"`, `"code"`) or a template string with named fields.
        judge_correction_template (`str`, *optional*, defaults to `"math"`):
            Correction prompt: a preset name (`"math"`, `"code"`) or a template string.
        reference_column (`str`, *optional*, defaults to `"solution"`):
            Dataset column with the reference solution shown to the judge (required for `judge="self"` and
            `"base"`).
        rollout_schedule (`str`, *optional*, defaults to `"auto"`):
            `"continuous"`: each trajectory goes generate -> review -> correct at its own pace (a chunk is reviewed
            as soon as it is done, the policy keeps generating for the others, judge calls run concurrently); needs
            single-process colocated vLLM. `"barrier"`: lock-step rounds for every engine (the reference; vLLM
            server mode and tensor parallelism use it). `"auto"`: continuous where the engine supports it. Same
            trajectories for a greedy policy and a deterministic judge.
    """

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["judge_chat_template_kwargs"]

    # group composition
    num_control_generations: int = field(
        default=8,
        metadata={"help": "On-policy control rollouts per prompt. Their mean reward is the baseline V(x)."},
    )
    num_intervened_generations: int = field(
        default=8,
        metadata={"help": "Rollouts per prompt that the judge reviews and corrects during the intervention phase."},
    )
    num_generations: int | None = field(
        default=None,
        metadata={"help": "Rollouts per prompt; derived as num_control_generations + num_intervened_generations."},
    )
    # rollout loop
    chunk_size: int = field(
        default=512, metadata={"help": "Policy tokens generated between two reviews (paper: 512 math, 128 code)."}
    )
    max_reviews: int = field(
        default=4, metadata={"help": "Reviews per intervened rollout; afterwards the rest is generated unreviewed."}
    )
    max_correction_tokens: int = field(default=64, metadata={"help": "Cap on a judge correction, in policy tokens."})
    intervention_steps: int = field(
        default=200,
        metadata={
            "help": "Optimizer steps with interventions (paper: 200 of 500); afterwards every rollout is an "
            "on-policy control. 0 never intervenes."
        },
    )
    intervention_stop_gap: float | None = field(
        default=None,
        metadata={
            "help": "Adaptive switch-off (the paper's suggested improvement): stop intervening for good once the "
            "moving average of reward_intervened - reward_control falls below this value, i.e. once corrections "
            "no longer help. None keeps the fixed `intervention_steps` schedule only."
        },
    )
    intervention_gap_ema: float = field(
        default=0.9, metadata={"help": "Smoothing of the reward-gap moving average used by intervention_stop_gap."}
    )
    judge_token_target: float | None = field(
        default=None,
        metadata={
            "help": "Intervention budget controller: hold the share of judge tokens among completion tokens near this "
            "value (e.g. 0.03) by reviewing only a share of the intervened slots each step (the others run as "
            "controls). None: every intervened slot is reviewed."
        },
    )
    # voting judges
    judge_votes: int = field(
        default=1,
        metadata={
            "help": "Reviews per chunk, requested in the same judge call and sampled at judge_temperature (> 0 for a "
            "model judge)."
        },
    )
    judge_min_agree: int = field(
        default=1,
        metadata={
            "help": "Revise only when at least this many of the judge_votes reviews flag a step at or before step i; "
            "the cut is at the smallest such i. Failed reviews abstain."
        },
    )
    # loss
    anchor: str = field(
        default="const",
        metadata={
            "help": "Anchor a_t of judge tokens in the regression: 'const' uses `kappa`, 'proxy' the old policy's "
            "log-prob. Policy tokens are always anchored by the old log-prob.",
            "choices": list(ANCHORS),
        },
    )
    kappa: float = field(
        default=-0.2,
        metadata={"help": "Constant anchor for judge tokens with anchor='const' (paper: -0.2 math, -0.1 code)."},
    )
    regression_beta: float = field(
        default=1e-3, metadata={"help": "Scale of the summed log-ratio in the advantage regression (paper's beta2)."}
    )
    beta: float = field(
        default=0.0, metadata={"help": "KL coefficient of GRPO. MInTRL's regression has no KL term: keep 0."}
    )
    vllm_importance_sampling_correction: bool = field(
        default=False,
        metadata={"help": "MInTRL uses no importance sampling: the regression target holds for any trajectory."},
    )
    # judge
    judge: str = field(
        default="self",
        metadata={
            "help": "Judge backend: 'self' (the current policy with the reference solution as privileged context), "
            "'base' (the initial weights with the same context, as in the paper's self-intervention ablation: the "
            "policy with its PEFT adapter disabled, or else a frozen copy loaded from the policy's path), 'model' "
            "(a second model from `judge_model_name_or_path`), 'endpoint' (OpenAI-compatible server at "
            "`judge_base_url`). Ignored when a judge object is passed to the trainer.",
            "choices": list(JUDGE_BACKENDS),
        },
    )
    judge_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Judge model (local path or Hub id) for judge='model'."}
    )
    judge_chat_template_kwargs: dict | str | None = field(
        default_factory=lambda: dict(NO_THINKING),
        metadata={
            "help": "Chat-template arguments for the judge's prompts (judge='self', 'base', 'model', on either "
            "engine). The default turns thinking off: a thinking template (Qwen3) otherwise spends the review "
            "budget inside <think>, the review is cut off and counted as a failure, and the judge never intervenes. "
            "Templates that do not use a variable ignore it; {} renders the template's defaults. The endpoint judge "
            "renders on its server and does not use this field."
        },
    )
    judge_vllm_gpu_memory_utilization: float | None = field(
        default=None,
        metadata={
            "help": "With judge='model' (or 'base' without PEFT) and use_vllm: run the judge in a second colocated "
            "vLLM engine with this share of GPU memory (lower the policy's vllm_gpu_memory_utilization to fit both). "
            "None generates the judge with transformers."
        },
    )
    judge_base_url: str | None = field(
        default=None,
        metadata={"help": "OpenAI-compatible base URL for judge='endpoint', e.g. http://127.0.0.1:8000/v1."},
    )
    judge_model: str | None = field(default=None, metadata={"help": "Model name sent to the endpoint judge."})
    judge_api_key_env: str = field(
        default="OPENAI_API_KEY", metadata={"help": "Environment variable holding the endpoint judge's API key."}
    )
    judge_timeout_s: float = field(default=60.0, metadata={"help": "Timeout of one endpoint judge request."})
    judge_max_retries: int = field(default=3, metadata={"help": "Retries of a failed endpoint judge request."})
    judge_max_concurrency: int = field(default=16, metadata={"help": "Concurrent endpoint judge requests."})
    judge_temperature: float = field(default=0.0, metadata={"help": "Judge sampling temperature (0: greedy)."})
    judge_max_review_tokens: int = field(
        default=256,
        metadata={
            "help": "Token budget of a judge review answer (reasoning + verdict line). A review cut by it fails."
        },
    )
    judge_review_template: str = field(
        default="math",
        metadata={"help": "Review prompt: a preset name ('math', 'code') or a template string with named fields."},
    )
    judge_correction_template: str = field(
        default="math",
        metadata={"help": "Correction prompt: a preset name ('math', 'code') or a template string."},
    )
    reference_column: str = field(
        default="solution",
        metadata={
            "help": "Dataset column with the reference solution shown to the judge (required for judge='self')."
        },
    )
    rollout_schedule: str = field(
        default="auto",
        metadata={
            "help": "How intervention rollouts advance. 'continuous': each trajectory goes generate -> review -> "
            "correct at its own pace, its chunks joining the policy engine's running batch and the judge answering "
            "while the policy generates for the others (needs an engine with continuous batching: single-process "
            "colocated vLLM). 'barrier': lock-step rounds, one policy call, one review call and one correction call "
            "for all unfinished trajectories (every engine; vLLM server mode and tensor parallelism need it, since "
            "each call there is a collective). 'auto': continuous where the engine supports it. Both give the same "
            "trajectories for a greedy policy and a deterministic judge; see docs/mintrl.md."
        },
    )

    def __post_init__(self):
        total = self.num_control_generations + self.num_intervened_generations
        if self.num_control_generations < 1:
            raise ValueError(
                "num_control_generations must be >= 1: the control rollouts' mean reward is the baseline."
            )
        if self.num_intervened_generations < 0:
            raise ValueError("num_intervened_generations must be >= 0.")
        if self.num_generations is None:
            self.num_generations = total
        elif self.num_generations != total:
            raise ValueError(
                f"num_generations={self.num_generations} conflicts with num_control_generations="
                f"{self.num_control_generations} + num_intervened_generations={self.num_intervened_generations} = "
                f"{total}. Leave num_generations unset (it is derived) or make it equal to the sum."
            )
        if self.anchor not in ANCHORS:
            raise ValueError(f"anchor={self.anchor!r} is not one of {ANCHORS}.")
        if self.judge not in JUDGE_BACKENDS:
            raise ValueError(f"judge={self.judge!r} is not one of {JUDGE_BACKENDS}.")
        self.judge_chat_template_kwargs = chat_template_kwargs_field(
            "judge_chat_template_kwargs", self.judge_chat_template_kwargs
        )
        if self.judge == "model" and not self.judge_model_name_or_path:
            raise ValueError("judge='model' needs judge_model_name_or_path (a local path or Hub id of the judge).")
        if self.judge == "endpoint" and not (self.judge_base_url and self.judge_model):
            raise ValueError("judge='endpoint' needs judge_base_url (e.g. http://127.0.0.1:8000/v1) and judge_model.")
        for name in ("chunk_size", "max_correction_tokens", "judge_max_review_tokens", "judge_max_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("max_reviews", "intervention_steps", "judge_max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        resolve_template(self.judge_review_template, "review")  # errors name the field
        resolve_template(self.judge_correction_template, "correction")
        if not 0.0 <= self.intervention_gap_ema < 1.0:
            raise ValueError(f"intervention_gap_ema must be in [0, 1), got {self.intervention_gap_ema}.")
        target = self.judge_token_target
        if target is not None and not 0.0 < target < 1.0:
            raise ValueError(
                f"judge_token_target must be in (0, 1) (a share of completion tokens, e.g. 0.03) or None, got {target}."
            )
        if self.judge_votes < 1:
            raise ValueError(f"judge_votes must be >= 1 (reviews per chunk), got {self.judge_votes}.")
        if not 1 <= self.judge_min_agree <= self.judge_votes:
            raise ValueError(
                f"judge_min_agree={self.judge_min_agree} must be between 1 and judge_votes={self.judge_votes}: a "
                "revision needs that many of the chunk's reviews to agree."
            )
        share = self.judge_vllm_gpu_memory_utilization
        if share is not None and not 0.0 < share < 1.0:
            raise ValueError(f"judge_vllm_gpu_memory_utilization must be in (0, 1), got {share}.")
        if self.rollout_schedule not in ROLLOUT_SCHEDULES:
            raise ValueError(f"rollout_schedule={self.rollout_schedule!r} is not one of {ROLLOUT_SCHEDULES}.")
        if self.regression_beta <= 0:
            raise ValueError(f"regression_beta must be > 0, got {self.regression_beta}.")
        if self.beta != 0.0:
            raise ValueError(
                f"beta={self.beta}: MInTRL's advantage regression has no KL term. Set beta=0 and tune regression_beta."
            )
        super().__post_init__()
