"""RL settings for the toy task shared by the demo, the benchmarks and the tests: one place to build a GRPO,
MInTRL, SORT or MInTRL + SORT trainer on the warm start with the same data, budgets and optimiser.

The optimiser settings are the ones that keep plain GRPO stable on this task (constant learning rate after a short
warm-up, grad-norm clipping at 1.0, no KL, asymmetric clipping 0.2/0.28 as in SORT's main update), so a method's
gain or loss is not an optimiser artefact. The warm-up is `warmup_schedule`'s: `constant_with_warmup` trains the first
optimizer step at learning rate 0, which loses MInTRL's first intervention step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trl_mintrl import cpu_training_fields

from .hint import HINT_TEACHER_TEMPLATE, WARM_START_HINT_DIR, rule_planner
from .reference_styles import write_reference
from .task import BAND_OPERATORS, STEP_SEPARATOR, make_problems, step_reward, toy_reward
from .warm_start import WARM_START_DIR

METHODS = ("grpo", "mintrl-const", "mintrl-proxy", "sort", "mintrl-sort")
# SORT's repair settings, shared by "sort" and "mintrl-sort" (MInTRL with SORT's repair, const anchor)
SORT_REPAIR = dict(reference_column="solution", repair_batch_size=8, max_plan_tokens=64)
RL_MIN_OPS, RL_MAX_OPS = 8, 11
WARMUP_STEPS = 3
# the learning benchmarks' problem seeds: training prompts (plus the run's seed), held-out and validation problems
TRAIN_SEED, HELDOUT_SEED, VALIDATION_SEED = 1000, 999, 998


@dataclass(frozen=True)
class Regime:
    """Which problems RL trains and evaluates on, and the settings that depend on their length."""

    min_ops: int
    max_ops: int
    new_op: bool | str  # every chain ends with this operator the warm start never saw (True: `#`)
    max_completion_length: int
    max_reviews: int  # MInTRL: reviews of 16 tokens, enough to reach the step that matters
    new_op_count: int = 1  # how many of a chain's operations are the new operator (the last, and others at random)
    judge_notation: str = "far"  # the rule judge's notation (`benchmarks.tasks.toy.task.rule_judge`)
    reward: Callable = toy_reward  # the reward RL trains on (held-out scoring uses `Problem.solved`, the same test)
    warm_start: Path = WARM_START_DIR  # the checkpoint every arm starts from
    notation: str = "far"  # the reference solutions' notation (`Problem.written_steps`): SORT's and judges' column
    planner: Callable | None = None  # -> a `trl_mintrl.sort.Planner` for SORT arms (None: the policy writes plans)
    sort_overrides: dict = field(default_factory=dict)  # SORT config fields of the regime (its teacher prompt)

    def problems(self, n: int, seed: int):
        return make_problems(
            n, self.min_ops, self.max_ops, seed=seed, new_op=self.new_op, new_op_count=self.new_op_count
        )

    def dataset(self, n: int, seed: int, reference_style: str | None = None):
        """`n` rows of `problems(n, seed)`, the `solution` column in the regime's notation or in `reference_style`
        (`benchmarks.tasks.toy.reference_styles`)."""
        from datasets import Dataset

        def reference(problem) -> str:
            if reference_style is None:
                return STEP_SEPARATOR.join(problem.written_steps(self.notation))
            return write_reference(problem, reference_style)

        return Dataset.from_list([{**p.row(), "solution": reference(p)} for p in self.problems(n, seed)])

    def judge(self, seed: int = 0, **kwargs):
        """The regime's rule judge (`rule_judge` in the regime's judge notation; `kwargs` override)."""
        from .task import rule_judge

        return rule_judge(seed=seed, **{"notation": self.judge_notation, **kwargs})


def _band(symbol: str) -> Regime:
    """A regime of the in-band family: chains of 3-6 operations, two of them `a op b = a+b+k` (the rule of
    `symbol`, the last operation and one other), every rule step checked by the reward, references and the judge's
    corrections in the policy's notation (`12+3=14`), reviews covering the whole completion (6 x 16 tokens)."""
    return Regime(
        3,
        6,
        new_op=symbol,
        new_op_count=2,
        max_completion_length=96,
        max_reviews=6,
        reward=step_reward,
        notation="near",
        judge_notation="near",
    )


REGIMES = {
    # hard but reachable: long chains of familiar operations; the warm start solves some, GRPO has signal
    "reachable": Regime(RL_MIN_OPS, RL_MAX_OPS, new_op=False, max_completion_length=160, max_reviews=2),
    # unreachable: short chains ending in `a#b = a+b+2`, a rule no prompt states; warm-start pass@8 <= 5%, but the
    # policy's near misses (`a+b` off by 2) find it by luck and GRPO learns it from them
    "unreachable": Regime(3, 6, new_op=True, max_completion_length=96, max_reviews=4),
    # out of reach: the same chains ending in `a@b = a+b-7`, far from the policy's near misses, answers uniform over
    # 0-12 and the `@` step checked by the reward (`step_reward`), so neither a guess nor a slip scores
    "out-of-reach": Regime(3, 6, new_op="@", max_completion_length=96, max_reviews=4, reward=step_reward),
    # SORT's regime: the out-of-reach problems, from the hint warm start (it applies a rule stated
    # in its prompt, trained on other operators and offsets; `benchmarks.tasks.toy.hint`), references in the policy's
    # notation (`15+1=9`) and the rule planner's plan (`Rule: a@b = a+b-7.`) in the teacher prompt it was trained on
    "sort-hint": Regime(
        3,
        6,
        new_op="@",
        max_completion_length=96,
        max_reviews=4,
        reward=step_reward,
        warm_start=WARM_START_HINT_DIR,
        notation="near",
        planner=rule_planner,
        sort_overrides={"teacher_template": HINT_TEACHER_TEMPLATE},
    ),
    # MInTRL's regime: outside the inference support (warm-start pass@8 <= 1%, pass@64 <= 5%: two
    # applications of `a~b = a+b-1` make the whole solution rare) and inside the training support (each correction is
    # unlikely, not impossible, for the warm start: `correction_nats` <= 7); calibrated in every run
    "in-band": _band("~"),
    # the judge's distance swept: the same design with the rule's offset k moved (`BAND_OPERATORS`), so that the
    # corrections' NLL under the warm start runs from near to far; "in-band" is the k = -1 point
    **{f"distance{k:+d}": _band(symbol) for symbol, k in BAND_OPERATORS.items() if symbol != "~"},
}
DISTANCE_REGIMES = ["in-band", *(f"distance{k:+d}" for symbol, k in BAND_OPERATORS.items() if symbol != "~")]


def run_fields(output_dir: str | Path, *, steps: int, seed: int) -> dict:
    """The bookkeeping fields of every trainer the toy and the benchmarks build: CPU, fp32, no activation
    checkpointing, no reports (`cpu_training_fields`), no checkpoints, a log line per optimizer step."""
    return cpu_training_fields(
        output_dir=str(output_dir),
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        seed=seed,
        max_steps=steps,
    )


def phase_end_step(steps: int) -> int:
    """The default intervention phase's last step: 40% of the steps, as the paper's 200 of 500 (MInTRL's
    `intervention_steps`); the learning runs also score every arm there, and the lower-rate arms lower it from there."""
    return max(1, int(0.4 * steps))


def rl_fields(
    method: str, output_dir: str | Path, *, steps: int, seed: int = 0, regime: str = "reachable", **overrides
) -> dict:
    """The config fields of `method` with the toy RL defaults of `regime`; `overrides` are config fields."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {sorted(REGIMES)}")
    common = dict(
        **run_fields(output_dir, steps=steps, seed=seed),
        per_device_train_batch_size=128,  # 16 prompts x 8 rollouts per optimizer step
        num_generations=8,
        max_completion_length=REGIMES[regime].max_completion_length,
        temperature=1.0,
        learning_rate=1e-4,
        lr_scheduler_type="constant",  # with `warmup_schedule`'s warm-up (build_trainer)
        max_grad_norm=1.0,
        beta=0.0,
    )
    if method == "grpo":
        return {**common, "epsilon": 0.2, "epsilon_high": 0.28, **overrides}
    sort_repair = {**SORT_REPAIR, **REGIMES[regime].sort_overrides}
    if method == "sort":
        return {**common, **sort_repair, **overrides}
    del common["num_generations"]
    mintrl = dict(
        num_control_generations=4,
        num_intervened_generations=4,
        chunk_size=16,
        max_reviews=REGIMES[regime].max_reviews,
        max_correction_tokens=16,
        intervention_steps=phase_end_step(steps),
        anchor="proxy" if method == "mintrl-proxy" else "const",
        reference_column="solution",
        step_split="blank_line",  # the toy writes its steps as paragraphs; its committed runs split at blank lines
    )
    if method == "mintrl-sort":
        return {**common, **mintrl, **sort_repair, **overrides}
    return {**common, **mintrl, **overrides}


def rl_config(
    method: str, output_dir: str | Path, *, steps: int, seed: int = 0, regime: str = "reachable", **overrides
):
    """The config object of `method` with the toy RL defaults of `regime` (`rl_fields`)."""
    fields = rl_fields(method, output_dir, steps=steps, seed=seed, regime=regime, **overrides)
    if method == "grpo":
        from trl import GRPOConfig

        return GRPOConfig(**fields)
    if method == "sort":
        from trl_mintrl.sort import SORTConfig

        return SORTConfig(**fields)
    if method == "mintrl-sort":
        from trl_mintrl.combined import MInTRLSORTConfig

        return MInTRLSORTConfig(**fields)
    from trl_mintrl.mintrl import MInTRLConfig

    return MInTRLConfig(**fields)


def build_trainer(
    method: str,
    model,
    tokenizer,
    train_dataset,
    args,
    judge="rule",
    callbacks=None,
    reward: Callable = toy_reward,
    planner=None,
    schedule: dict | None = None,
    environment_factory=None,
):
    """A trainer for `method` (`rl_config(method, ...)` as `args`) with the toy's learning-rate schedule
    (`warmup_schedule(trainer, **schedule)`). MInTRL's `judge`: "rule" (the toy rule judge), a `Judge` object, or
    None to build the one `args.judge` names (e.g. the self-judge). `reward`: the regime's (`REGIMES[name].reward`).
    `planner`: SORT's and MInTRL + SORT's (a `trl_mintrl.sort.Planner`; None: the policy writes the plans).
    `environment_factory`: TRL's, for the tool task (`benchmarks.tasks.toy.tool_task.RegisterEnv`)."""
    kwargs = dict(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    if environment_factory is not None:
        kwargs["environment_factory"] = environment_factory
    return warmup_schedule(_trainer(method, kwargs, judge, planner), **(schedule or {}))


def _trainer(method: str, kwargs: dict, judge, planner):
    if method == "grpo":
        from trl import GRPOTrainer

        return GRPOTrainer(**kwargs)
    if method == "sort":
        from trl_mintrl.sort import SORTTrainer

        return SORTTrainer(**kwargs, planner=planner)
    from trl_mintrl.combined import MInTRLSORTTrainer
    from trl_mintrl.mintrl import MInTRLTrainer

    from .task import rule_judge

    if method == "mintrl-sort":
        kwargs["planner"] = planner
    trainer_cls = MInTRLSORTTrainer if method == "mintrl-sort" else MInTRLTrainer
    return trainer_cls(**kwargs, judge=rule_judge() if judge == "rule" else judge)


def warmup_schedule(trainer, *, later_factor: float = 1.0, later_from: int | None = None):
    """Give `trainer` the toy's learning-rate schedule: `lr x min(1, (step + 1) / WARMUP_STEPS)`, so the first
    optimizer step trains at a third of the rate (transformers' `constant_with_warmup` trains it at 0, losing MInTRL's
    first intervention step); from optimizer step `later_from` on (e.g. the end of MInTRL's intervention phase) the
    rate is `later_factor` times that (the retention arms' lower on-policy rate, for every method alike). Replaces
    `create_scheduler`, which the trainer calls once the optimizer exists."""
    from torch.optim.lr_scheduler import LambdaLR

    def factor(step: int) -> float:
        later = later_factor if later_from is not None and step >= later_from else 1.0
        return min(1.0, (step + 1) / WARMUP_STEPS) * later

    def create_scheduler(num_training_steps, optimizer=None):
        if trainer.lr_scheduler is None:
            trainer.lr_scheduler = LambdaLR(optimizer or trainer.optimizer, factor)
        return trainer.lr_scheduler

    trainer.create_scheduler = create_scheduler
    return trainer
