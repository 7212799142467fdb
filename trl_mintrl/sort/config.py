"""`SORTConfig`: `GRPOConfig` with the paper's clipping defaults and the repair settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from ..losses import REPAIR_WEIGHTINGS
from ..text import chat_template_kwargs_field, check_template
from .templates import PLAN_TEMPLATE, REQUIRED_FIELDS, TEACHER_TEMPLATE


@dataclass
class SORTConfig(GRPOConfig):
    r"""
    Configuration class for the [`SORTTrainer`] (Selective Off-policy Reference Tuning, arXiv 2605.11505).

    All [`~trl.GRPOConfig`] parameters apply; the main update is GRPO. Defaults that differ from `GRPOConfig` follow
    the paper: asymmetric clipping `epsilon=0.2`, `epsilon_high=0.28`, and no KL term (`beta=0.0`).

    Parameters:
        > Parameters that control the deferred repair of all-wrong prompts

        reference_column (`str`, *optional*, defaults to `"solution"`):
            Dataset column holding the reference solution `y*` of each prompt.
        correctness_reward_funcs (`list[str | int]` or `None`, *optional*, defaults to `None`):
            Names (as logged, e.g. `"math_reward"`) or indices of the reward functions that decide whether a rollout
            is correct; `None` uses all of them. Leave out format bonuses and other shaping terms, or their reward
            makes wrong rollouts look correct and all-wrong prompts never reach the buffer.
        correct_threshold (`float`, *optional*, defaults to `0.0`):
            A rollout is correct when the weighted sum of its `correctness_reward_funcs` rewards exceeds this. A
            prompt is deferred when none of its rollouts is correct (and all are scorable).
        repair_update (`str`, *optional*, defaults to `"separate"`):
            `"separate"`: the paper's alternation, a repair optimizer step of its own (with its own gradient
            clipping) right after the GRPO step, at the same learning rate; it does not advance the learning-rate
            schedule or `global_step`. `"joint"`: the repair loss is added to the GRPO loss of that step.
        repair_weighting (`str`, *optional*, defaults to `"salience"`):
            `"salience"`: the paper's plan-salience token weights. `"uniform"`: weight 1 on every reference token
            (plain SFT on references, the ablation that isolates the plan); no plan is written.
        repair_batch_size (`int`, *optional*, defaults to `8`):
            Number of buffered all-wrong prompts that triggers a repair; each repair uses exactly that many.
        repair_beta (`float`, *optional*, defaults to `0.5`):
            Exponent of the plan probability in the token weight `p_base**(1 - beta) * p_plan**beta`.
        repair_loss_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the repair loss (in its own step with `repair_update="separate"`, added to the GRPO loss with
            `"joint"`).
        repair_optimizer (`str`, *optional*, defaults to `"own"`):
            Optimizer state of the `"separate"` repair step (ignored with `"joint"`, which has one step). `"own"`: the
            trainer's optimizer (same class, hyperparameters and parameter groups, so the learning rate is the main
            schedule's current one) with moments and step counter of its own, the paper's decoupled auxiliary update:
            the repair's Adam direction is that of the repair gradients, and the main state advances once per main
            step. `"shared"`: the main optimizer's state, so Adam's first moment is ~90% GRPO momentum when the
            repair steps and its step counter advances twice on repairing steps. Either way the learning-rate schedule
            advances with the main steps only (under DeepSpeed too). `"own"` keeps a second copy of the optimizer
            state (for AdamW two more fp32 tensors per trained parameter, partitioned like the main state under
            ZeRO); it restarts at zero on resume, and Adam's bias correction makes that a well-scaled first step.
        repair_buffer_size (`int` or `None`, *optional*, defaults to `None`):
            Capacity of the deferred buffer; past it the oldest item is evicted (counted in `sort/evictions`). `None`:
            `4 * repair_batch_size`, the all-wrong prompts of a Qwen2.5-7B recipe step (64 prompts, repairs of 16).
        max_repairs_per_step (`int` or `None`, *optional*, defaults to `None`):
            Most repairs per optimizer step (each on `repair_batch_size` items; with `"separate"` each is an optimizer
            step of its own, with `"joint"` each adds its loss to the step). `None`:
            `ceil(repair_buffer_size / repair_batch_size)`, enough to drain a full buffer in one step, so no backlog
            outlives the step after it; the repair's compute per step is bounded by this times a repair.
        max_plan_tokens (`int`, *optional*, defaults to `256`):
            Maximum number of tokens of a plan written by the policy.
        plan_temperature (`float`, *optional*, defaults to `0.0`):
            Sampling temperature of plan writing; `0.0` decodes greedily.
        plan_batch_size (`int` or `None`, *optional*, defaults to `None`):
            Most plans per generation call. Plans are written without gradients, so their batch is not tied to the
            training micro-batch (`per_device_train_batch_size`, which bounds the scoring passes). `None`: every plan
            of a repair in one generation call per process, the fastest on GPU and with vLLM. Set a number to bound
            the generation's KV cache, which holds plans x (plan prompt + plan) tokens, at long references on big
            models (the arithmetic is in the SORT choices page, section "Plan generation").
        plan_chat_template_kwargs (`dict`, *optional*, defaults to `{"enable_thinking": False}`):
            Chat-template arguments for the plan-extraction prompt, on top of `chat_template_kwargs`. The default
            turns off Qwen3-style thinking (templates that do not use it ignore it): a plan is a short list, and a
            thinking block would spend `max_plan_tokens` before the plan starts. The base and teacher prompts are
            scoring contexts and are rendered with `chat_template_kwargs` only, as the rollouts are.
        max_reference_tokens (`int`, *optional*, defaults to `1024`):
            References longer than this are truncated to their first `max_reference_tokens` tokens (no EOS is then
            appended) and counted in `sort/truncated_references`.
        plan_template (`str`, *optional*):
            Plan-extraction prompt, with `{question}` and `{reference}` placeholders.
        teacher_template (`str`, *optional*):
            Teacher prompt, with `{question}` and `{plan}` placeholders.
        base_template (`str` or `None`, *optional*, defaults to `None`):
            Base prompt, with a `{question}` placeholder. `None` scores the reference after the dataset prompt exactly
            as the rollouts see it.
    """

    epsilon: float = field(
        default=0.2,
        metadata={"help": "Lower clipping epsilon of the GRPO update (paper: 0.2)."},
    )
    epsilon_high: float | None = field(
        default=0.28,
        metadata={"help": "Upper clipping epsilon of the GRPO update (paper: 0.28, asymmetric clipping)."},
    )
    beta: float = field(
        default=0.0,
        metadata={"help": "KL coefficient of the GRPO update; the paper uses none (0.0)."},
    )
    reference_column: str = field(
        default="solution",
        metadata={"help": "Dataset column holding the reference solution of each prompt."},
    )
    correctness_reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Names or indices of the reward functions that decide whether a rollout is correct (None: all). "
            "Leave out format bonuses, or wrong rollouts look correct and nothing is ever deferred."
        },
    )
    correct_threshold: float = field(
        default=0.0,
        metadata={
            "help": "A rollout is correct when the weighted sum of its correctness rewards exceeds this; a prompt "
            "with no correct rollout is deferred for repair."
        },
    )
    repair_update: str = field(
        default="separate",
        metadata={
            "help": "'separate': a repair optimizer step of its own after the GRPO step (the paper's alternation; "
            "same learning rate, own clipping, no extra scheduler step). 'joint': repair loss added to the GRPO loss.",
            "choices": ["separate", "joint"],
        },
    )
    repair_weighting: str = field(
        default="salience",
        metadata={
            "help": "'salience': the paper's plan-salience token weights. 'uniform': weight 1 on every reference "
            "token (plain SFT on references, no plan).",
            "choices": list(REPAIR_WEIGHTINGS),
        },
    )
    repair_batch_size: int = field(
        default=8,
        metadata={
            "help": "Number of buffered all-wrong prompts that triggers a repair (paper: 64 for Llama-3.2-3B, 16 for "
            "Qwen2.5-7B, 8 for Qwen3-4B)."
        },
    )
    repair_beta: float = field(
        default=0.5,
        metadata={
            "help": "Exponent of the plan probability in the token weight p_base**(1-beta) * p_plan**beta; 0.5 is "
            "the paper's geometric mean, 0 gives DFT-style weights, 1 plan-only weights."
        },
    )
    repair_loss_weight: float = field(
        default=1.0,
        metadata={"help": "Weight of the repair loss added to the GRPO loss of the step that runs the repair."},
    )
    repair_optimizer: str = field(
        default="own",
        metadata={
            "help": "Optimizer state of the 'separate' repair step. 'own': moments and step counter of its own "
            "(same optimizer class, hyperparameters and current learning rate), the paper's decoupled auxiliary "
            "update. 'shared': the main optimizer's state (the repair inherits the GRPO momentum). The schedule "
            "advances with main steps only either way.",
            "choices": ["own", "shared"],
        },
    )
    repair_buffer_size: int | None = field(
        default=None,
        metadata={
            "help": "Capacity of the deferred buffer; the oldest item is evicted past it (sort/evictions). None: "
            "4 * repair_batch_size."
        },
    )
    max_repairs_per_step: int | None = field(
        default=None,
        metadata={
            "help": "Most repairs (of repair_batch_size items each) per optimizer step. None: "
            "ceil(repair_buffer_size / repair_batch_size), enough to drain a full buffer."
        },
    )
    max_plan_tokens: int = field(
        default=256,
        metadata={"help": "Maximum number of tokens of a plan written by the policy."},
    )
    plan_temperature: float = field(
        default=0.0,
        metadata={"help": "Sampling temperature of plan writing; 0.0 decodes greedily."},
    )
    plan_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Most plans per generation call. Plans are generated without gradients, so their batch is not "
            "tied to the training micro-batch. None: every plan of a repair in one generation call per process "
            "(fastest on GPU and with vLLM); set a number to bound the generation's KV-cache memory at long "
            "references on big models."
        },
    )
    plan_chat_template_kwargs: dict | str | None = field(
        default_factory=lambda: {"enable_thinking": False},
        metadata={
            "help": "Chat-template arguments of the plan prompt, on top of chat_template_kwargs; the default turns "
            "thinking off (ignored by templates without it)."
        },
    )
    max_reference_tokens: int = field(
        default=1024,
        metadata={"help": "Longer references are truncated to this many tokens (and counted in a metric)."},
    )
    plan_template: str = field(
        default=PLAN_TEMPLATE,
        metadata={"help": "Plan-extraction prompt with {question} and {reference} placeholders."},
    )
    teacher_template: str = field(
        default=TEACHER_TEMPLATE,
        metadata={"help": "Teacher prompt with {question} and {plan} placeholders."},
    )
    base_template: str | None = field(
        default=None,
        metadata={
            "help": "Base prompt with a {question} placeholder. None scores the reference after the dataset prompt "
            "exactly as the rollouts see it."
        },
    )

    def __post_init__(self):
        if not self.reference_column:
            raise ValueError("`reference_column` must name the dataset column holding the reference solutions.")
        for name in ("repair_batch_size", "max_plan_tokens", "max_reference_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be at least 1, got {getattr(self, name)}.")
        if not 0.0 <= self.repair_beta <= 1.0:
            raise ValueError(f"`repair_beta` must be in [0, 1] (0.5 is the paper's), got {self.repair_beta}.")
        if self.repair_loss_weight < 0:
            raise ValueError(f"`repair_loss_weight` must be >= 0, got {self.repair_loss_weight}.")
        self._check_plan_batch_size()
        if self.plan_temperature < 0:
            raise ValueError(f"`plan_temperature` must be >= 0 (0 is greedy), got {self.plan_temperature}.")
        for name, choices in (
            ("repair_update", ("separate", "joint")),
            ("repair_weighting", tuple(REPAIR_WEIGHTINGS)),
            ("repair_optimizer", ("own", "shared")),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"`{name}` must be one of {list(choices)}, got {getattr(self, name)!r}.")
        self._check_buffer_bounds()
        self.plan_chat_template_kwargs = chat_template_kwargs_field(
            "plan_chat_template_kwargs", self.plan_chat_template_kwargs
        )
        self._check_correctness_reward_funcs()
        if self.remove_unused_columns:
            raise ValueError(
                f"`remove_unused_columns=True` would drop the reference column `{self.reference_column}` before the "
                "trainer sees it; set `remove_unused_columns=False`."
            )
        check_template("plan_template", self.plan_template, REQUIRED_FIELDS["plan_template"])
        check_template("teacher_template", self.teacher_template, REQUIRED_FIELDS["teacher_template"])
        if self.base_template is not None:
            check_template("base_template", self.base_template, REQUIRED_FIELDS["base_template"])
        super().__post_init__()

    def _check_plan_batch_size(self) -> None:
        size = self.plan_batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(
                f"`plan_batch_size` must be a positive integer, or None to write every plan of a repair in one "
                f"generation call, got {size!r}."
            )

    def _check_buffer_bounds(self) -> None:
        capacity, max_repairs = repair_buffer_bounds(self)
        if capacity < self.repair_batch_size:
            raise ValueError(
                f"`repair_buffer_size` ({self.repair_buffer_size}) is below `repair_batch_size` "
                f"({self.repair_batch_size}): the buffer could never hold a repair's worth. Raise it to at least "
                f"{self.repair_batch_size}, or leave it None (4 * repair_batch_size)."
            )
        if max_repairs < 1:
            raise ValueError(
                f"`max_repairs_per_step` must be at least 1, got {self.max_repairs_per_step}; leave it None to drain "
                "a full buffer each step."
            )

    def _check_correctness_reward_funcs(self) -> None:
        """Shape only: names are checked against the reward functions when the trainer is built."""
        selection = self.correctness_reward_funcs
        if selection is None:
            return
        if isinstance(selection, (str, int)):
            selection = self.correctness_reward_funcs = [selection]
        if not selection:
            raise ValueError("`correctness_reward_funcs` is empty; use None for all reward functions, or name some.")
        for entry in selection:
            if isinstance(entry, bool) or not isinstance(entry, (str, int)):
                raise ValueError(
                    f"`correctness_reward_funcs` holds reward function names or indices, got {entry!r} "
                    f"({type(entry).__name__})."
                )


def repair_buffer_bounds(args: SORTConfig) -> tuple[int, int]:
    """The buffer's capacity and the most repairs per step: `repair_buffer_size` (None: `4 * repair_batch_size`) and
    `max_repairs_per_step` (None: `ceil(capacity / repair_batch_size)`, enough to drain a full buffer)."""
    capacity = 4 * args.repair_batch_size if args.repair_buffer_size is None else args.repair_buffer_size
    if args.max_repairs_per_step is not None:
        return capacity, args.max_repairs_per_step
    return capacity, math.ceil(capacity / args.repair_batch_size)
