"""`MInTRLConfig`: GRPOConfig plus the intervention, judge and regression settings of MInTRL. Those
settings and their checks are `MInTRLFields`, which `AsyncMInTRLConfig` mixes into TRL's `AsyncGRPOConfig` too."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from trl import GRPOConfig

from ..judges.templates import resolve_template
from ..losses import ANCHORS as ANCHOR_VARIANTS
from ..text import NO_THINKING, chat_template_kwargs_field
from .steps import STEP_SPLITS

ANCHORS = tuple(ANCHOR_VARIANTS)  # the variant table in losses.py
JUDGE_BACKENDS = ("self", "base", "model", "endpoint")
JUDGE_OUTAGE_POLICIES = ("stop", "continue")
ROLLOUT_SCHEDULES = ("auto", "continuous", "barrier")


def refusal_entries(names: str, why: str, instead: str) -> dict[str, tuple[str, str]]:
    """Entries of a refused-fields table (`refused_fields`): each of the space-separated `names` -> (why, what to do
    instead), one reason shared by fields refused together."""
    return dict.fromkeys(names.split(), (why, instead))


# GRPOConfig fields that MInTRL's rollout and loss do not read, or cannot honour. A value other than the config's own
# default is refused in `__post_init__` (before any model loads) instead of being silently ignored: field -> (why,
# what to do instead). docs/grpo-fields.md is the table for users; tests/test_grpo_fields.py checks it against this.
REFUSED_GRPO_FIELDS: dict[str, tuple[str, str]] = {
    **refusal_entries(
        "beta sync_ref_model ref_model_mixup_alpha ref_model_sync_steps use_bias_correction_kl",
        "MInTRL's advantage regression has no KL term to a reference model, so no reference model is built",
        "the regression is already KL-regularised through `regression_beta` (the paper's beta2): tune that",
    ),
    **refusal_entries(
        "loss_type epsilon epsilon_high delta sapo_temperature_neg sapo_temperature_pos vespo_k_pos "
        "vespo_lambda_pos vespo_k_neg vespo_lambda_neg importance_sampling_level off_policy_mask_threshold",
        "MInTRL replaces GRPO's clipped policy-gradient loss by a sequence-level advantage regression, with no "
        "probability ratio, no clipping and no loss-type variants",
        "shape the update with `regression_beta`, `anchor` and `kappa`",
    ),
    **refusal_entries(
        "scale_rewards multi_objective_aggregation",
        "MInTRL's advantage is the reward minus the mean reward of the prompt's control rollouts, with no division "
        "by a standard deviation (the paper's baseline)",
        "weigh or rescale rewards with `reward_weights` or in the reward functions",
    ),
    **refusal_entries(
        "top_entropy_quantile entropy_coef use_adaptive_entropy entropy_coef_min entropy_coef_max "
        "entropy_coef_delta entropy_target",
        "the regression sums over every completion token (judge tokens included), with no entropy mask and no "
        "entropy bonus",
        "the `entropy` metric is still logged; MInTRL has no entropy term to tune",
    ),
    **refusal_entries(
        "vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max "
        "vllm_importance_sampling_clip_min vllm_importance_sampling_cap",
        "MInTRL uses no importance sampling: the regression target holds for any trajectory the behaviour policy "
        "produces, vLLM-sampled ones included",
        "nothing to set; vLLM rollouts are regressed as sampled",
    ),
    **refusal_entries(
        "router_aux_loss_coef",
        "MInTRL's loss does not add a Mixture-of-Experts router load-balancing loss",
        "leave it None (no auxiliary loss is added)",
    ),
    **refusal_entries(
        "use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged "
        "vllm_structured_outputs_regex",
        "MInTRL generates through its own chunked intervention loop (batched `model.generate`, or vLLM with "
        "`use_vllm`), not through TRL's generation path",
        "use `use_vllm=True` for a faster engine",
    ),
    **refusal_entries(
        "ds3_gather_for_generation",
        "ranks run different numbers of rollout rounds under ZeRO-3, which needs the gathered weights",
        "the weights are gathered for generation only, not for training",
    ),
}


@dataclass
class MInTRLFields:
    """MInTRL's own fields and checks (documented in `MInTRLConfig`), mixed in before a TRL config: its fields follow
    the TRL config's, and its `__post_init__` checks them, then runs the TRL config's. Each config names in
    `refused_fields` the fields of its TRL config that MInTRL cannot honour."""

    # TRL config fields refused at any value but the config's default: field -> (why, what to do instead)
    refused_fields: ClassVar[dict[str, tuple[str, str]]] = {}

    # group composition
    num_generations: int | None = field(
        default=None,
        metadata={
            "help": "Rollouts per prompt (None: GRPOConfig's 8, or the sum of the two split fields when both are "
            "given). Split half controls, half intervened; an odd number gives the extra one to the controls."
        },
    )
    num_control_generations: int | None = field(
        default=None,
        metadata={
            "help": "On-policy control rollouts per prompt; their mean reward is the baseline V(x). None: derived "
            "from num_generations."
        },
    )
    num_intervened_generations: int | None = field(
        default=None,
        metadata={
            "help": "Rollouts per prompt that the judge reviews and corrects during the intervention phase. None: "
            "derived from num_generations."
        },
    )
    # rollout loop
    chunk_size: int = field(
        default=512, metadata={"help": "Policy tokens generated between two reviews (paper: 512 math, 128 code)."}
    )
    max_reviews: int = field(
        default=4, metadata={"help": "Reviews per intervened rollout; afterwards the rest is generated unreviewed."}
    )
    max_correction_tokens: int = field(
        default=64,
        metadata={
            "help": "Cap on a judge correction inserted into a rollout, in the policy's tokens (a longer one is cut). "
            "The judge's own budget for writing it, in its tokens, is judge_max_correction_tokens."
        },
    )
    end_at_judge_answer: bool = field(
        default=False,
        metadata={
            "help": "A correction that writes a final answer (a \\boxed{}, a GSM8K '#### N' line, 'the answer is') "
            "outside an open <think> ends the rollout there, with EOS: the reward reads the judge's answer, so text "
            "the policy wrote after it would share that reward unread. Off: the policy continues after it."
        },
    )
    step_split: str = field(
        default="line",
        metadata={
            "help": "Where a reviewed chunk splits into the steps the judge numbers: 'line' at every line break, "
            "'blank_line' at blank lines only (the paper's), 'auto' at blank lines when the chunk has one between "
            "two lines of text, else at lines. Code blocks split at their fence lines and the blank lines inside "
            "them in every mode.",
            "choices": list(STEP_SPLITS),
        },
    )
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
        metadata={
            "help": "Constant anchor for judge tokens with anchor='const' (paper: -0.2 math, -0.1 code). A "
            "log-probability: at most 0."
        },
    )
    regression_beta: float = field(
        default=1e-3, metadata={"help": "Scale of the summed log-ratio in the advantage regression (paper's beta2)."}
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
    judge_max_correction_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Token budget of a judge's correction answer, in the judge's own tokens (a model or endpoint "
            "judge; a correction cut by it fails). None: max_correction_tokens, the same number as the rollout's cap."
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
    judge_check_endpoint: bool = field(
        default=True,
        metadata={
            "help": "judge='endpoint': before the model loads, check that judge_base_url answers and serves "
            "judge_model (GET /models, when the server lists its models), and stop with an error naming the field to "
            "fix. Set False when the server comes up after training starts; judge_outage_policy still watches it."
        },
    )
    judge_outage_policy: str = field(
        default="stop",
        metadata={
            "help": "When no judge request gets an answer (connection refused, timeout, HTTP error) for "
            "judge_outage_steps training steps in a row: 'stop' saves a checkpoint and stops training with an error "
            "(resume once the judge is back); 'continue' trains on as GRPO with a control baseline and warns every "
            "judge_outage_steps such steps.",
            "choices": list(JUDGE_OUTAGE_POLICIES),
        },
    )
    judge_outage_steps: int = field(
        default=3,
        metadata={
            "help": "Consecutive training steps without one answered judge request after which judge_outage_policy "
            "acts."
        },
    )
    reference_column: str = field(
        default="solution",
        metadata={
            "help": "Dataset column with the reference solution shown to the judge (required for judge='self')."
        },
    )
    # absorption warning
    absorption_window: int = field(
        default=12,
        metadata={
            "help": "Intervention steps over which the trend of mintrl/judge_token_nll is fitted; once per run the "
            "trainer warns when the trend ends above absorption_max_nll and fell by less than absorption_min_fall."
        },
    )
    absorption_max_nll: float = field(
        default=1.0,
        metadata={"help": "Judge-token NLL (nats per token) at or below which corrections count as absorbed."},
    )
    absorption_min_fall: float = field(
        default=0.5,
        metadata={
            "help": "Relative fall of the judge-token NLL over absorption_window (0.5: halved) at or above which a "
            "still-high NLL counts as being absorbed."
        },
    )
    # regime warnings
    judge_share_warning: float | None = field(
        default=0.25,
        metadata={
            "help": "Warn (once per run) when the judge writes more than this share of the completion tokens on each "
            "of 2 intervention steps in a row: the paper's corrections are 2-4% of the tokens, and its ablation found "
            "~40% worse than no intervention. The warning names judge_token_target. None: never."
        },
    )
    control_length_warning: float | None = field(
        default=0.5,
        metadata={
            "help": "Warn (once per run) when, over 2 steps, the controls' mean length has covered this share of the "
            "way from their length at the first intervention step to max_completion_length, with a quarter of them "
            "cut at the cap: the policy is learning to run on from the intervened rollouts (watched during the "
            "interventions and after them, when the growth can go on). Also warns when half the controls are cut at "
            "the cap over the first 2 intervention steps (their reward then reads no answer: every gradient is the "
            "judge's). The warnings name mask_truncated_completions. None: neither."
        },
    )
    revised_length_warning: float | None = field(
        default=1.5,
        metadata={
            "help": "Warn (once per run) when, over 2 intervention steps that revised any rollout, the revised rollouts "
            "are at least this many times the controls' length (every token counted) and score above them: the "
            "corrections add the steps the policy leaves out, and the controls learn to grow to that length. The "
            "warning names a warm-up on whole solutions. None: never."
        },
    )
    # rollout schedule
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
    speculative_chunks: bool = field(
        default=True,
        metadata={
            "help": "Continuous schedule only: while a chunk is under review, generate the next chunk from its end; "
            "used when the judge keeps the chunk (the review's latency hidden), aborted when it revises (its tokens "
            "wasted). Same trajectories for a greedy policy and a deterministic judge."
        },
    )

    def __post_init__(self):
        self._split_group()
        self._refuse_unused_fields()
        self._check_choices()
        self._check_loss()
        self._check_judge()
        self._check_counts()
        self._check_schedule()
        self._check_absorption()
        self._check_regime_warnings()
        super().__post_init__()

    def _check_choices(self) -> None:
        """Fields that name one of a fixed set of variants."""
        for name, choices in (
            ("anchor", ANCHORS),
            ("judge", JUDGE_BACKENDS),
            ("judge_outage_policy", JUDGE_OUTAGE_POLICIES),
            ("rollout_schedule", ROLLOUT_SCHEDULES),
            ("step_split", STEP_SPLITS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {choices}.")

    def _check_loss(self) -> None:
        if self.kappa > 0:
            raise ValueError(
                f"kappa={self.kappa}: kappa is the log-probability the judge tokens are anchored at "
                "(anchor='const'), and a log-probability cannot be above 0. Use a value <= 0 (paper: -0.2 math, "
                "-0.1 code)."
            )
        if self.regression_beta <= 0:
            raise ValueError(f"regression_beta must be > 0, got {self.regression_beta}.")

    def _check_judge(self) -> None:
        """The judge backend's settings, its prompts and its votes; normalises `judge_chat_template_kwargs`."""
        self.judge_chat_template_kwargs = chat_template_kwargs_field(
            "judge_chat_template_kwargs", self.judge_chat_template_kwargs
        )
        if self.judge == "model" and not self.judge_model_name_or_path:
            raise ValueError("judge='model' needs judge_model_name_or_path (a local path or Hub id of the judge).")
        if self.judge == "endpoint" and not (self.judge_base_url and self.judge_model):
            raise ValueError("judge='endpoint' needs judge_base_url (e.g. http://127.0.0.1:8000/v1) and judge_model.")
        resolve_template(self.judge_review_template, "review")  # errors name the field
        resolve_template(self.judge_correction_template, "correction")
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

    def _check_counts(self) -> None:
        """Token budgets, step counts and request counts."""
        for name in (
            "chunk_size",
            "max_correction_tokens",
            "judge_max_review_tokens",
            "judge_max_concurrency",
            "judge_outage_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.judge_max_correction_tokens is not None and self.judge_max_correction_tokens < 1:
            raise ValueError(
                f"judge_max_correction_tokens must be >= 1 or None (max_correction_tokens), got "
                f"{self.judge_max_correction_tokens}."
            )
        for name in ("max_reviews", "intervention_steps", "judge_max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")

    def _check_schedule(self) -> None:
        """The adaptive switch-off and the intervention budget controller."""
        if not 0.0 <= self.intervention_gap_ema < 1.0:
            raise ValueError(f"intervention_gap_ema must be in [0, 1), got {self.intervention_gap_ema}.")
        target = self.judge_token_target
        if target is not None and not 0.0 < target < 1.0:
            raise ValueError(
                f"judge_token_target must be in (0, 1) (a share of completion tokens, e.g. 0.03) or None, got {target}."
            )

    def _check_regime_warnings(self) -> None:
        for name in ("judge_share_warning", "control_length_warning"):
            value = getattr(self, name)
            if value is not None and not 0 < value < 1:
                raise ValueError(f"{name} must be in (0, 1) (a share) or None to turn the warning off, got {value}.")
        ratio = self.revised_length_warning
        if ratio is not None and not ratio > 1:
            raise ValueError(
                f"revised_length_warning must be > 1 (revised rollouts' length over the controls', e.g. 1.5) or None "
                f"to turn the warning off, got {ratio}."
            )

    def _check_absorption(self) -> None:
        if self.absorption_window < 2:
            raise ValueError(
                f"absorption_window must be >= 2 (a trend needs two steps), got {self.absorption_window}."
            )
        if self.absorption_max_nll <= 0:
            raise ValueError(f"absorption_max_nll must be > 0 (nats per judge token), got {self.absorption_max_nll}.")
        if not 0.0 < self.absorption_min_fall < 1.0:
            raise ValueError(
                f"absorption_min_fall must be in (0, 1) (a relative fall, 0.5: halved), got {self.absorption_min_fall}."
            )

    def _split_group(self) -> None:
        """Resolve `num_generations` and its split into controls and intervened rollouts (see the docstring)."""
        total = self.num_generations
        controls, intervened = self.num_control_generations, self.num_intervened_generations
        if controls is not None and intervened is not None:
            if total is not None and total != controls + intervened:
                raise ValueError(
                    f"num_generations={total} conflicts with num_control_generations={controls} + "
                    f"num_intervened_generations={intervened} = {controls + intervened}. Set num_generations alone "
                    "(split half and half), or the two split fields (num_generations is their sum)."
                )
            total = controls + intervened
        else:
            if total is None:
                total = GRPOConfig.__dataclass_fields__["num_generations"].default
            if controls is None and intervened is None:
                controls = (total + 1) // 2  # the extra rollout of an odd group goes to the baseline
            if controls is None:
                controls = total - intervened
            intervened = total - controls
        if total < 2:
            raise ValueError(
                f"num_generations={total}: MInTRL needs at least 2 rollouts per prompt (one control for the "
                "baseline, and, as in GRPO, a second rollout to compare it with). Set num_generations >= 2, e.g. 2 "
                "for 1 control + 1 intervened (or num_control_generations and num_intervened_generations)."
            )
        if controls < 1:
            raise ValueError(
                f"num_control_generations={controls} (num_generations={total}, num_intervened_generations="
                f"{intervened}): the control rollouts' mean reward is the baseline, so at least 1 is needed. Lower "
                "num_intervened_generations or raise num_generations."
            )
        if intervened < 0:
            raise ValueError(
                f"num_intervened_generations={intervened}: num_control_generations={controls} exceeds "
                f"num_generations={total}. Raise num_generations, or set num_intervened_generations too."
            )
        self.num_generations = total
        self.num_control_generations, self.num_intervened_generations = controls, intervened

    def _refuse_unused_fields(self) -> None:
        """A `refused_fields` field set to anything but this config's default would be silently ignored."""
        defaults = {f.name: f.default for f in fields(self)}
        for name, (why, instead) in self.refused_fields.items():
            value = getattr(self, name)
            if name == "scale_rewards":  # GRPOConfig also takes booleans: True is "group", False "none"
                value = {True: "group", False: "none"}.get(value, value)
            if value != defaults[name]:
                raise ValueError(
                    f"{name}={value!r} is refused by MInTRL: {why}. Leave {name} at its default "
                    f"({defaults[name]!r}); {instead}."
                )


@dataclass
class MInTRLConfig(MInTRLFields, GRPOConfig):
    r"""
    Configuration class for the [`MInTRLTrainer`] (Minimal-Intervention RL).

    [`~trl.GRPOConfig`] parameters apply, except those of GRPO's loss, advantage normalisation, reference model and
    generation path that MInTRL replaces: a non-default value of one of them (`REFUSED_GRPO_FIELDS`, e.g. `beta`,
    `loss_type`, `scale_rewards`, `epsilon`) is refused when the config is built, with the reason and what to use
    instead. The table of every `GRPOConfig` field is in the docs (GRPOConfig fields). The parameters below are
    MInTRL's own; defaults follow the paper (Table 6) where it gives a value.

    Parameters:
        > Parameters that control the group of rollouts

        num_generations (`int` or `None`, *optional*, defaults to `None`):
            Rollouts per prompt, the `GRPOConfig` knob: `None` means `GRPOConfig`'s `8`, or the sum of the two fields
            below when both are given. Without them it is split half and half (paper: 8 + 8, `num_generations=16`);
            an odd number gives the extra rollout to the controls (`3`: 2 controls + 1 intervened), since they
            alone make the baseline and a group always needs one. `1` is refused: a group needs a control for its
            baseline and, as in GRPO, at least 2 rollouts to learn from.
        num_control_generations (`int` or `None`, *optional*, defaults to `None`):
            On-policy control rollouts per prompt; their mean reward is the baseline V(x). `None`: derived from
            `num_generations` (half, rounded up, or what `num_intervened_generations` leaves). At least 1.
        num_intervened_generations (`int` or `None`, *optional*, defaults to `None`):
            Rollouts per prompt that the judge reviews and corrects during the intervention phase. `None`: derived
            from `num_generations` (half, rounded down, or what `num_control_generations` leaves). `0` turns the
            judge off (every rollout is a control).

        > Parameters that control the rollout loop

        chunk_size (`int`, *optional*, defaults to `512`):
            Policy tokens generated between two reviews (paper: 512 math, 128 code).
        max_reviews (`int`, *optional*, defaults to `4`):
            Reviews per intervened rollout; afterwards the rest is generated unreviewed.
        max_correction_tokens (`int`, *optional*, defaults to `64`):
            Cap on a judge correction inserted into a rollout, in the policy's tokens (a longer one is cut; paper: 64).
            The judge's own budget for writing it, in its tokens, is `judge_max_correction_tokens`.
        end_at_judge_answer (`bool`, *optional*, defaults to `False`):
            A correction that writes a final answer (`\\boxed{}`, a GSM8K `#### N` line, "the answer is"; as
            `trl_mintrl.rewards.math_reward` reads one) outside an open `<think>` ends the rollout there: the
            judge's EOS follows it. The reward reads the judge's answer, so whatever the policy wrote after it would
            share that reward unread, and the regression would push up running on (docs/mintrl.md, the length
            warnings). Off: the policy continues after any correction, as in the paper.
        step_split (`str`, *optional*, defaults to `"line"`):
            Where a reviewed chunk splits into the steps the judge numbers (a REVISE keeps the steps before the
            flagged one): `"line"` at every line break (blank lines stay with the step before them), `"blank_line"`
            at blank lines only (the paper's steps), `"auto"` at blank lines when the chunk has a blank line between
            two lines of text, else at lines. Code blocks split at their fence lines and at blank lines inside them in
            every mode, never at each line of code. `"line"` by default: chat models often write one step per line
            with no blank line, and the paper's split then makes the whole chunk one step, so any REVISE drops all
            of it; for a model that writes paragraphs `"line"` only splits further where a paragraph itself has line
            breaks (docs/mintrl.md).
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
            Constant anchor for judge tokens with `anchor="const"` (paper: -0.2 math, -0.1 code). A log-probability:
            at most 0.
        regression_beta (`float`, *optional*, defaults to `1e-3`):
            Scale of the summed log-ratio in the advantage regression (the paper's beta2).
        beta (`float`, *optional*, defaults to `0.0`):
            KL coefficient of GRPO. MInTRL's regression has no KL term: any other value is refused.
        vllm_importance_sampling_correction (`bool`, *optional*, defaults to `False`):
            MInTRL uses no importance sampling (the regression target holds for any trajectory): `True` is refused.

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
            Token budget of a judge review answer (reasoning + verdict line), in the judge's tokens. A review cut by
            it fails.
        judge_max_correction_tokens (`int` or `None`, *optional*, defaults to `None`):
            Token budget of a judge correction answer, in the judge's tokens (model and endpoint judges); a
            correction cut by it fails. `None`: `max_correction_tokens`, the rollout's cap in the policy's tokens.
        judge_review_template (`str`, *optional*, defaults to `"math"`):
            Review prompt: a preset name (`"math"`, `"code"`) or a template string with named fields.
        judge_correction_template (`str`, *optional*, defaults to `"math"`):
            Correction prompt: a preset name (`"math"`, `"code"`) or a template string.
        judge_check_endpoint (`bool`, *optional*, defaults to `True`):
            With `judge="endpoint"`: before the model loads, check that `judge_base_url` answers and serves
            `judge_model` (`GET /models`, when the server lists its models), and stop with an error naming the field
            to fix. Set `False` when the server comes up after training starts; `judge_outage_policy` still watches
            it during training.
        judge_outage_policy (`str`, *optional*, defaults to `"stop"`):
            What happens when no judge request gets an answer (connection refused, timeout, HTTP error) for
            `judge_outage_steps` training steps in a row, so that the run is training as GRPO with a control
            baseline: `"stop"` saves a checkpoint and stops training with an error (resume once the judge is back),
            `"continue"` trains on and warns every `judge_outage_steps` such steps. Judges that run in-process never
            go unanswered.
        judge_outage_steps (`int`, *optional*, defaults to `3`):
            Consecutive training steps without one answered judge request after which `judge_outage_policy` acts.
        reference_column (`str`, *optional*, defaults to `"solution"`):
            Dataset column with the reference solution shown to the judge (required for `judge="self"` and
            `"base"`).
        rollout_schedule (`str`, *optional*, defaults to `"auto"`):
            `"continuous"`: each trajectory goes generate -> review -> correct at its own pace (a chunk is reviewed
            as soon as it is done, the policy keeps generating for the others, judge calls run concurrently); needs
            single-process colocated vLLM. `"barrier"`: lock-step rounds for every engine (the reference; vLLM
            server mode and tensor parallelism use it). `"auto"`: continuous where the engine supports it. Same
            trajectories for a greedy policy and a deterministic judge.
        speculative_chunks (`bool`, *optional*, defaults to `True`):
            Continuous schedule only: while a chunk is under review, the policy already writes the next chunk from
            its end. Kept by the judge (most reviews), the next chunk is ready and the review's latency is hidden;
            revised, it is aborted and its tokens are wasted compute. Same trajectories for a greedy policy.

        > Parameters that control the absorption warning

        absorption_window (`int`, *optional*, defaults to `12`):
            Intervention steps (steps with judge tokens) over which the trend of `mintrl/judge_token_nll` is fitted
            (an exponential trend). Once per run the trainer warns that corrections are not being absorbed when the
            trend ends above `absorption_max_nll` and fell by less than `absorption_min_fall` over the window. The
            defaults separate the toy benchmark's judges: corrections in the policy's notation fell from 1.6 to 0.7
            nats within 12 steps, corrections in a notation it never wrote stayed above 1.7 after 20.
        absorption_max_nll (`float`, *optional*, defaults to `1.0`):
            Judge-token NLL (nats per token) at or below which corrections count as absorbed.
        absorption_min_fall (`float`, *optional*, defaults to `0.5`):
            Relative fall of the judge-token NLL over the window (0.5: halved) at or above which a still-high NLL
            counts as being absorbed.

        > Parameters that control the regime warnings (each once per run, from the second intervention step)

        judge_share_warning (`float` or `None`, *optional*, defaults to `0.25`):
            Warn when the judge writes more than this share of the completion tokens on each of 2 intervention steps
            in a row. The paper's corrections are at most 64 tokens in rollouts of thousands (2-4% of the tokens);
            its intensity ablation found ~40% worse than no intervention. The default sits between what helped and
            what did not here: the toy benchmark gained at 16-23% a step, while on SmolLM2-135M with 22-token answers
            45-55% at the first steps (34-38% over the phase) grew every run's completions to the cap. The warning
            names `judge_token_target`. `None`: never.
        control_length_warning (`float` or `None`, *optional*, defaults to `0.5`):
            Warn when the controls' mean length over 2 steps has covered this share of the way from their length
            at the first intervention step to `max_completion_length`, with at least a quarter of them cut at the
            cap. Controls are plain policy samples: their length climbing is the policy learning to run on from what
            intervened rollouts reward (on SmolLM2-135M: 22 to 47-52 of 64 tokens by the fourth or fifth
            intervention step). Watched after the interventions too: at an 8-18% share on longer solutions the
            controls kept their length over the 8 intervention steps and grew to the cap in the 5 after. Also warns
            when half the controls are cut at the cap over the first 2 intervention steps: a reward that reads the
            final answer then scores them about 0, and every gradient comes from the judge-completed rollouts. The
            warnings name `mask_truncated_completions`. `None`: neither.
        revised_length_warning (`float` or `None`, *optional*, defaults to `1.5`):
            Warn when, over 2 intervention steps that revised any rollout, the revised rollouts are at least this many
            times the controls' length (every token counted) and score above them. A correction that adds the steps the
            policy left out, rather than replacing a wrong one, puts every positive advantage on a rollout longer than
            the policy writes. On SmolLM2-135M in band the intervened rollouts (revised or not) were about 1.5-2.2 times
            the controls' length at the first two intervention steps and the controls grew toward and past that length,
            at every judge-token share tried; in the reachable regime (0.96-1.06 times) nothing grew. The warning names
            a warm-up on whole solutions. `None`: never.
    """

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["judge_chat_template_kwargs"]

    refused_fields = REFUSED_GRPO_FIELDS

    # GRPOConfig fields with MInTRL's defaults
    beta: float = field(
        default=0.0, metadata={"help": "KL coefficient of GRPO. MInTRL's regression has no KL term: keep 0."}
    )
    vllm_importance_sampling_correction: bool = field(
        default=False,
        metadata={"help": "MInTRL uses no importance sampling: the regression target holds for any trajectory."},
    )
