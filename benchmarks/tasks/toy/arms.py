"""The toy task's learning arms and run settings, one definition for every study that trains on it: each label's
method and config, the run sizes of each mode, the trainer metrics a run keeps, and one (regime, label, seed) job with
its rule judge and SORT planner. A study that builds its jobs here runs the very jobs of `learning.json`, so a
recorded run can be reused (`benchmarks.lib.records.split_recorded`)."""

from __future__ import annotations

from .training import REGIMES

# SFT before GRPO (`sft-grpo`): one epoch over the run's training prompts' references (48 steps x 8 rows = the 384
# prompts GRPO then trains on), the warm start's optimiser at a constant rate. 3e-4 was fixed before any run: three
# times the RL rate (SFT usually runs hotter than RL) and a tenth of the warm start's peak; not tuned on results.
SFT_FIRST = dict(batch_size=8, learning_rate=3e-4)
# label -> (method of benchmarks.tasks.toy.training, config overrides); keys starting with "_" are job settings, not
# config fields: `_batch_factor` (grpo-2x: twice the rollouts for the same prompts), `_judge_notation` (the rule
# judge's notation; the regime's unless set), `_on_policy_lr_factor` (the learning rate times this after the
# intervention phase), `_judge_share_decay` (the judge-token target falls to 0 over the phase: `decaying_judge_share`),
# `_learned_judge` (MInTRL's judge is the learned toy judge, `benchmarks.tasks.toy.learned_judge`, which the trainer
# builds from its config: `judge="model"`), `_sft_first` (SFT on the references before the method), `_reference_style`
# (the references rewritten in a style of `benchmarks.tasks.toy.reference_styles`)
LABELS = {
    "grpo": ("grpo", {}),
    "grpo-2x": ("grpo", {"num_generations": 16, "_batch_factor": 2}),
    "mintrl-const": ("mintrl-const", {}),
    "mintrl-proxy": ("mintrl-proxy", {}),
    "mintrl-const-near": ("mintrl-const", {"_judge_notation": "near"}),
    "mintrl-const-far": ("mintrl-const", {"_judge_notation": "far"}),
    "mintrl-proxy-near": ("mintrl-proxy", {"_judge_notation": "near"}),
    "mintrl-proxy-far": ("mintrl-proxy", {"_judge_notation": "far"}),
    "mintrl-off": ("mintrl-const", {"intervention_steps": 0}),
    # reachable: reviews covering the whole completion (10 x 16 tokens = max_completion_length)
    "mintrl-const-full": ("mintrl-const", {"max_reviews": 10}),
    # retention arms: what keeps what the interventions taught once they stop
    "mintrl-const-adaptive": ("mintrl-const", {"intervention_stop_gap": 0.1}),
    "mintrl-const-decay": ("mintrl-const", {"judge_token_target": 0.15, "_judge_share_decay": True}),
    "grpo-lowlr": ("grpo", {"_on_policy_lr_factor": 0.3}),
    "mintrl-const-lowlr": ("mintrl-const", {"_on_policy_lr_factor": 0.3}),
    "sort": ("sort", {}),
    "sort-uniform": ("sort", {"repair_weighting": "uniform"}),
    "sort-beta0": ("sort", {"repair_beta": 0.0}),  # DFT weighting: p_base only
    "sort-beta1": ("sort", {"repair_beta": 1.0}),  # p_plan only
    # the separate repair stepping the GRPO step's optimizer state (Adam moments), not its own
    "sort-shared": ("sort", {"repair_optimizer": "shared"}),
    "sft-grpo": ("grpo", {"_sft_first": SFT_FIRST}),
}
# the trainer's metrics a run keeps in its per-step logs
LOGGED = (
    "loss",
    "grad_norm",
    "learning_rate",
    "entropy",
    "reward",
    "frac_reward_zero_std",
    "completions/mean_length",
    "mintrl/judge_token_frac",
    "mintrl/intervention_rate",
    "mintrl/interventions_active",
    "mintrl/reward_gap",
    "mintrl/reward_control",
    "mintrl/reward_intervened",
    "mintrl/judge_token_nll",
    "mintrl/regression_residual",
    "mintrl/corrections_not_absorbed",
    "mintrl/judge_failures",
    "mintrl/judge_parse_failures",
    "sort/all_wrong_frac",
    "sort/repair_loss",
    "sort/mean_weight",
    "sort/salience_mean",
)
# a mode's run sizes: optimizer steps, seeds, held-out problems (final scores / curve), curve points, warm-start samples
# for the calibration (pass@64), prompts per step
MODE_SETTINGS = {
    # learning.py's --horizon (GRPO alone, 96 steps, 3 seeds): its curve is flat, within the curve set's noise, from
    # step 24 on every regime; 48 = twice that (docs/benchmarks.md, "Run time").
    "full": dict(
        steps=48,
        seeds=[0, 1, 2, 3, 4],
        final_prompts=96,
        curve_prompts=32,
        curve_points=4,
        calibration_samples=64,
        prompts_per_step=8,
    ),
    "quick": dict(
        steps=6,
        seeds=[0],
        final_prompts=32,
        curve_prompts=16,
        curve_points=2,
        calibration_samples=64,
        prompts_per_step=8,
    ),
    "smoke": dict(  # the tests: seconds
        steps=1,
        seeds=[0, 1],
        final_prompts=2,
        curve_prompts=2,
        curve_points=1,
        calibration_samples=8,
        prompts_per_step=2,
    ),
}


def mode_sizes(mode: str, **changes) -> dict:
    """A mode's run sizes (`MODE_SETTINGS`) for a study that measures no warm-start calibration, with `changes`."""
    return {k: v for k, v in MODE_SETTINGS[mode].items() if k != "calibration_samples"} | changes


def common_job_fields(settings: dict) -> dict:
    """The fields every job of a mode shares: steps, evaluation sets, prompts per step, curve spacing."""
    return {k: settings[k] for k in ("steps", "curve_prompts", "final_prompts", "prompts_per_step")} | {
        "eval_every": max(1, settings["steps"] // settings["curve_points"])
    }


def main_job(settings: dict, regime: str, label: str, method: str, overrides: dict, seed: int) -> dict:
    """One main-group job: `label` (trained by `method` with config `overrides`) on `regime` at `seed`, with the
    mode's common fields; every study builds its arms with it so that their runs are learning.py's."""
    return dict(
        common_job_fields(settings),
        name=f"{regime}-{label}-s{seed}",
        group="main",
        regime=regime,
        label=label,
        method=method,
        overrides=overrides,
        judge_steps=1,
        seed=seed,
    )


def sweep_job(settings: dict, regime: str, point: str, spec: dict, seed: int) -> dict:
    """One point of an intervention-intensity sweep: MInTRL-const on `regime` at `seed` with the point's job fields
    (`spec`: config overrides, steps per correction, whether the judge revises from the first step), scored at the
    end only."""
    return dict(
        common_job_fields(settings),
        eval_every=settings["steps"] + 1,  # final scores only
        name=f"{regime}-sweep-{point}-s{seed}",
        group="sweep",
        regime=regime,
        label=f"sweep:{point}",
        point=point,
        method="mintrl-const",
        seed=seed,
        **spec,
    )


def default_notation(regime_name: str) -> str:
    """The rule judge's notation of a regime's runs without `_judge_notation`: the regime's own; the previous
    version's regimes (no longer defined) used the far judge."""
    return REGIMES[regime_name].judge_notation if regime_name in REGIMES else "far"


def job_judge(job: dict):
    """The rule judge of a job: its steps per correction, errors (`judge_errors`: rate per kind of
    `benchmarks.tasks.toy.task.rule_judge`), from-start and notation settings (the regime's notation unless the label
    sets one); None for the learned judge, which the trainer builds from its config."""
    if job["overrides"].get("_learned_judge"):
        return None
    regime = REGIMES[job["regime"]]
    return regime.judge(
        job["seed"],
        steps_per_correction=job["judge_steps"],
        **job.get("judge_errors", {}),
        from_start=job.get("judge_from_start", False),
        notation=job["overrides"].get("_judge_notation", regime.judge_notation),
    )


def job_planner(job: dict):
    """The SORT planner of a job: its regime's (`Regime.planner`, e.g. sort-hint's rule planner) for SORT methods,
    else None (the policy writes the plans)."""
    factory = REGIMES[job["regime"]].planner
    return factory() if factory is not None and job["method"] in ("sort", "mintrl-sort") else None
