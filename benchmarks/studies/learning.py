"""When does guidance help? GRPO, MInTRL and SORT arms on regimes of the toy task, each defined by a measured
precondition.

    python -m benchmarks.studies.learning             # full run (see MODES["full"]; needs free cores)
    python -m benchmarks.studies.learning --quick     # 1 seed, 6 steps, 4 arms on the in-band regime (~1.5 min idle)
    python -m benchmarks.studies.learning --replot benchmarks/results/learning.json   # tables and plots from the JSON
    python -m benchmarks.studies.learning --recheck in-band:mintrl-const:0   # rerun a recorded run here, compare its scores

Regimes (`benchmarks.tasks.toy.training.REGIMES`), each with its calibration (warm-start pass@1 / pass@8 / pass@64, the
judge's corrections' NLL under the warm start `correction_nats`, and pass@1 / pass@8 on the same problems in familiar
notation) computed in every run and printed with its results: "in-band" = MInTRL's regime (issue 27): chains of 3-6
operations, two of them `a~b = a+b-1` (stated nowhere), every rule step checked by the reward (`step_reward`), so the
whole solution is out of sampling's reach while each correction is merely unlikely for the warm start; "distance-3" ..
"distance+2" = the same design with the rule's offset moved (the judge's distance swept, `BAND_OPERATORS`);
"out-of-reach" = short chains ending in `a@b = a+b-7` (answers uniform over 0-12, the `@` step checked), too far for
both sampling and training; "reachable" = long chains of familiar operations; "sort-hint" = SORT's regime, the
out-of-reach problems from the hint warm start (`benchmarks/tasks/toy/warm_start_hint/`: it applies a rule stated in its
prompt), with references in the policy's notation and the toy's rule planner writing SORT's plan
(`benchmarks.tasks.toy.hint`). ("unreachable", `a#b = a+b+2`, is the older benchmarks' regime, `beyond.py`'s.)
A MInTRL label's `-near` / `-far` suffix picks the rule judge's notation: the policy's (`14+3=10`) or the
reference's (`14@3=10`); without one, the regime's own (near on the in-band family, far elsewhere). Every arm starts
from its regime's committed warm start, trains for the same optimizer steps on the same prompts (per seed) with the
same optimiser and lr schedule (chosen for GRPO), and is evaluated on the same held-out problems (pass@1 and pass@8 from 8 samples at temperature 1). Each arm is
compared to GRPO by the paired difference over seeds with a 95% t-interval. `learning.json` records the command, the
commit, the settings and one record per run (regime, label, seed, final scores, curve of held-out pass@1 / pass@8,
per-step logs), and is rewritten after every run; `learning.md` and the PNGs are rendered from it.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.harness import by_seed, find_record, record_provenance, select, step_logs, verdict_cell
from benchmarks.lib.provenance import provenance
from benchmarks.lib.readme import markers
from benchmarks.lib.stats import format_interval, format_mean_std, mean_interval, paired_difference
from benchmarks.tasks.toy.training import DISTANCE_REGIMES, HELDOUT_SEED, TRAIN_SEED, VALIDATION_SEED

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"

# label -> (method of benchmarks.tasks.toy.training, config overrides); keys starting with "_" are job settings, not config
# fields: `_batch_factor` (grpo-2x: twice the rollouts for the same prompts), `_judge_notation` (the rule judge's
# notation; the regime's unless set), `_on_policy_lr_factor` (the learning rate times this after the intervention
# phase), `_judge_share_decay` (the judge-token target falls to 0 over the phase: `decaying_judge_share`),
# `_learned_judge` (MInTRL's judge is the learned toy judge, `benchmarks.tasks.toy.learned_judge`, which the trainer builds
# from its config: `judge="model"`)
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
    # retention arms (issue 27): what keeps what the interventions taught once they stop
    "mintrl-const-adaptive": ("mintrl-const", {"intervention_stop_gap": 0.1}),
    "mintrl-const-decay": ("mintrl-const", {"judge_token_target": 0.15, "_judge_share_decay": True}),
    "grpo-lowlr": ("grpo", {"_on_policy_lr_factor": 0.3}),
    "mintrl-const-lowlr": ("mintrl-const", {"_on_policy_lr_factor": 0.3}),
    "sort": ("sort", {}),
    "sort-uniform": ("sort", {"repair_weighting": "uniform"}),
    "sort-beta0": ("sort", {"repair_beta": 0.0}),  # DFT weighting: p_base only
    "sort-beta1": ("sort", {"repair_beta": 1.0}),  # p_plan only
    # issue 29: the separate repair stepping the GRPO step's optimizer state (Adam moments), not its own
    "sort-shared": ("sort", {"repair_optimizer": "shared"}),
}
# intervention-intensity sweep (MInTRL-const on the in-band regime, its near judge), from the fewest judge tokens to
# the most: point -> job fields (config overrides, steps per correction, judge revises every rollout from its first
# step). "off" and "default" are the main runs mintrl-off and mintrl-const; the targets hold the judge-token share
# near 1% / 3% (the paper's sweet spot is 2-4%); "whole-solution" is the off-policy extreme (the judge writes every
# intervened rollout from the start: about half of all tokens).
SWEEP_REGIME = "in-band"
SWEEP = {
    "off": None,
    "target-1%": dict(overrides={"judge_token_target": 0.01}, judge_steps=1),
    "target-3%": dict(overrides={"judge_token_target": 0.03}, judge_steps=1),
    "default": None,
    "all-steps": dict(overrides={"max_correction_tokens": 96}, judge_steps=8),
    "whole-solution": dict(overrides={"max_correction_tokens": 96}, judge_steps=8, judge_from_start=True),
}
SWEEP_MAIN = {"off": "mintrl-off", "default": "mintrl-const"}
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
REACHABLE_ARMS = ["grpo", "mintrl-const", "mintrl-const-full", "sort", "sort-uniform"]
NOTATION_ARMS = ["mintrl-const-near", "mintrl-const-far", "mintrl-proxy-near", "mintrl-proxy-far"]
BAND_ARMS = ["grpo", "grpo-2x", "mintrl-const", "mintrl-proxy", "mintrl-off", "sort", "sort-uniform"]
RETENTION_ARMS = ["mintrl-const-adaptive", "mintrl-const-decay", "grpo-lowlr", "mintrl-const-lowlr"]
DISTANCE_ARMS = ["grpo", "mintrl-const"]
# the full run in parts of at most ~90 minutes on 2 cores each (`--part`), merged into one learning.json: a part
# reruns its regimes' arms (all, or the labels it names) and the sweep if it says so, and keeps every other record
_SORT_ARMS = ["sort", "sort-uniform"]
PARTS = {
    "band": dict(regimes={"in-band": [a for a in BAND_ARMS + RETENTION_ARMS if a not in _SORT_ARMS]}, sweep=False),
    "distance": dict(regimes={regime: None for regime in DISTANCE_REGIMES[1:]}, sweep=True),
    "sort": dict(regimes={"in-band": _SORT_ARMS, "sort-hint": None}, sweep=False),
    # the controls on either side of the band, one part each (together 70 runs: over two hours on 2 cores)
    "out-of-reach": dict(regimes={"out-of-reach": None}, sweep=False),
    "reachable": dict(regimes={"reachable": None}, sweep=False),
}
MODES = {
    # steps, seeds, eval problems (final / curve), curve points, warm-start samples for the calibration (pass@64),
    # regimes -> labels, sweep seeds, prompts per step
    "full": dict(
        # --horizon (GRPO alone, 96 steps, 3 seeds): its curve is flat, within the curve set's noise, from step 24 on
        # every regime; 48 = twice that (docs/benchmarks.md, "Run time").
        steps=48,
        seeds=[0, 1, 2, 3, 4],
        final_prompts=96,
        curve_prompts=32,
        curve_points=4,
        calibration_samples=64,
        plan={
            # MInTRL's regime (issue 27), with the retention arms
            "in-band": BAND_ARMS + RETENTION_ARMS,
            # the judge's distance: the in-band design with the rule's offset moved
            **{regime: DISTANCE_ARMS for regime in DISTANCE_REGIMES[1:]},
            # the controls on either side: too far (the near and far judge) and within reach
            "out-of-reach": ["grpo", "grpo-2x", *NOTATION_ARMS, "mintrl-off", "sort", "sort-uniform"],
            "reachable": REACHABLE_ARMS,
            # SORT's regime (issue 19 section 3): hint warm start, rule planner, references in the near notation
            "sort-hint": ["grpo", "sort", "sort-uniform", "sort-beta0", "sort-beta1", "sort-shared"],
        },
        seeds_per_regime={regime: 3 for regime in DISTANCE_REGIMES[1:]},
        sweep_seeds=3,
        prompts_per_step=8,
    ),
    "quick": dict(
        steps=6,
        seeds=[0],
        final_prompts=32,
        curve_prompts=16,
        curve_points=2,
        calibration_samples=64,
        plan={"in-band": ["grpo", "mintrl-const", "mintrl-off", "sort-uniform"]},
        seeds_per_regime={},
        sweep_seeds=0,
        prompts_per_step=8,
    ),
    "horizon": dict(  # how long GRPO keeps improving on each regime: the steps the full mode needs (issue 19)
        steps=96,
        seeds=[0, 1, 2],
        final_prompts=96,
        curve_prompts=32,
        curve_points=8,
        calibration_samples=64,
        plan={"out-of-reach": ["grpo"], "reachable": ["grpo"], "sort-hint": ["grpo"]},
        seeds_per_regime={},
        sweep_seeds=0,
        prompts_per_step=8,
    ),
    "smoke": dict(  # the test: seconds
        steps=1,
        seeds=[0, 1],
        final_prompts=2,
        curve_prompts=2,
        curve_points=1,
        calibration_samples=8,
        plan={"in-band": ["grpo", "mintrl-const"]},
        seeds_per_regime={},
        sweep_seeds=0,
        prompts_per_step=2,
    ),
}


def run_job(job: dict, logged: tuple[str, ...] = LOGGED) -> dict:
    """Train one (regime, label, seed) run in this process; return its curve, final scores and logs (the `logged`
    metrics), its held-out scores at the end of the intervention phase (`phase_end`, every arm alike) and at the step
    a validation set selects (`selected`: weights kept in memory at every curve point and the phase end, the best
    validation pass@1 chosen, never the held-out set; ties go to the later step)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    from benchmarks.tasks.toy import evaluate, sample_completions
    from benchmarks.tasks.toy.evaluate import scores_of
    from benchmarks.tasks.toy.training import REGIMES, build_trainer, rl_config
    from benchmarks.tasks.toy.warm_start import sft_on_references

    torch.set_num_threads(1)
    regime = REGIMES[job["regime"]]
    tokenizer = AutoTokenizer.from_pretrained(regime.warm_start)
    model = AutoModelForCausalLM.from_pretrained(regime.warm_start)
    final_problems = regime.problems(job["final_prompts"], seed=HELDOUT_SEED)
    curve_problems = final_problems[: job["curve_prompts"]]  # = regime.problems(curve_prompts): drawn in order
    validation_problems = regime.problems(job.get("validation_prompts", job["curve_prompts"]), seed=VALIDATION_SEED)
    train = regime.dataset(
        job["steps"] * job["prompts_per_step"],
        seed=TRAIN_SEED + job["seed"],
        reference_style=job["overrides"].get("_reference_style"),
    )
    phase_end = phase_end_step(job["steps"])
    curve, validation, snapshots, phase, eval_seconds = {}, {}, {}, {}, 0.0

    class CurveCallback(TrainerCallback):
        """Held-out pass@1 / pass@8 every `eval_every` steps on the small curve set, on the whole held-out set at the
        end of the intervention phase, and validation scores with a copy of the weights at both (not counted in
        training time; sampling restores the torch RNG, so training is the same with or without them)."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            nonlocal eval_seconds
            step = state.global_step
            on_curve = step % job["eval_every"] == 0 and step < job["steps"]
            if not (on_curve or step == phase_end):
                return
            start = time.perf_counter()
            if on_curve:
                curve[step] = curve_point(evaluate(model, tokenizer, curve_problems, 8))
            if step == phase_end and step < job["steps"]:
                phase.update(curve_point(evaluate(model, tokenizer, final_problems, 8)), step=step)
            if step < job["steps"]:
                validation[step] = curve_point(evaluate(model, tokenizer, validation_problems, 8))
                snapshots[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            eval_seconds += time.perf_counter() - start

    sft, sft_seconds = job["overrides"].get("_sft_first"), 0.0
    if sft is not None:  # SFT on the references first (one epoch), then the method: its time counts as training
        start = time.perf_counter()
        sft_steps = sft_on_references(model, tokenizer, train, **sft)
        sft_seconds = time.perf_counter() - start
        sft_end = {**curve_point(evaluate(model, tokenizer, final_problems, 8)), "steps": sft_steps}
    overrides = {k: v for k, v in job["overrides"].items() if not k.startswith("_")}
    if job["overrides"].get("_learned_judge"):
        from benchmarks.tasks.toy.learned_judge import judge_config_fields

        overrides |= judge_config_fields()
    rollouts = 8 * job["overrides"].get("_batch_factor", 1)
    overrides["per_device_train_batch_size"] = job["prompts_per_step"] * rollouts
    args = rl_config(
        job["method"],
        f"/tmp/trl_mintrl_bench/{job['name']}",
        steps=job["steps"],
        seed=job["seed"],
        regime=job["regime"],
        **overrides,
    )
    callbacks = [CurveCallback()]
    if job["overrides"].get("_judge_share_decay"):
        callbacks.append(decaying_judge_share(phase_end))
    lower = job["overrides"].get("_on_policy_lr_factor")
    trainer = build_trainer(
        job["method"],
        model,
        tokenizer,
        train,
        args,
        judge=job_judge(job),
        callbacks=callbacks,
        reward=regime.reward,
        planner=job_planner(job),
        schedule=None if lower is None else {"later_factor": lower, "later_from": phase_end},
    )
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start - eval_seconds + sft_seconds
    # the curve set is a prefix of the held-out set: its last point comes from the final samples
    completions = sample_completions(trainer.model, tokenizer, final_problems, 8)
    final = scores_of(final_problems, completions, ks=(1, 8))
    n_curve = len(curve_problems)
    curve[job["steps"]] = curve_point(scores_of(curve_problems, completions[:n_curve]))
    validation[job["steps"]] = curve_point(evaluate(trainer.model, tokenizer, validation_problems, 8))
    best = max(validation, key=lambda step: (validation[step]["pass@1"], step))
    if best == job["steps"]:
        selected = curve_point(final)
    else:
        trainer.model.load_state_dict(snapshots[best])
        selected = curve_point(evaluate(trainer.model, tokenizer, final_problems, 8))
    logs = step_logs(trainer.state.log_history, logged)
    return {
        **job,
        "final": final,
        "curve": curve,
        "phase_end": phase or None,
        "validation": validation,
        "selected": {**selected, "step": best},
        "logs": logs,
        "train_seconds": train_seconds,
        **({"sft_end": sft_end} if sft is not None else {}),
    }


def decaying_judge_share(phase_end: int):
    """A callback for the decaying-judge-share arm: the intervention budget controller's target
    (`judge_token_target`, set by the arm's config) falls linearly from its configured value at step 0 to 0 at the end
    of the intervention phase (the controller holds the share of judge tokens near the target)."""
    from transformers import TrainerCallback

    class DecayingJudgeShare(TrainerCallback):
        start: float | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = self.start or args.judge_token_target
            args.judge_token_target = max(self.start * (1 - state.global_step / phase_end), 1e-3)

    return DecayingJudgeShare()


def job_judge(job: dict):
    """The rule judge of a job: its steps per correction, errors (`judge_errors`: rate per kind of
    `benchmarks.tasks.toy.rule_judge`), from-start and notation settings (the regime's notation unless the label sets one);
    None for the learned judge, which the trainer builds from its config."""
    from benchmarks.tasks.toy.training import REGIMES

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
    from benchmarks.tasks.toy.training import REGIMES

    factory = REGIMES[job["regime"]].planner
    return factory() if factory is not None and job["method"] in ("sort", "mintrl-sort") else None


def curve_point(scores: dict) -> dict:
    return {k: scores[k] for k in ("pass@1", "pass@8")}


def baseline(job: dict) -> dict:
    """The regime's calibration at the warm start on the held-out problems (`benchmarks.tasks.toy.calibration`: pass@1 /
    pass@8 / pass@64 from `calibration_samples` samples, 8 unless the job says, and the same problems in familiar
    notation where there is a new operator) and step 0 of every curve."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy import evaluate
    from benchmarks.tasks.toy.calibration import calibrate, judge_calibration
    from benchmarks.tasks.toy.training import REGIMES

    torch.set_num_threads(1)
    regime = REGIMES[job["regime"]]  # its warm start: the committed one, or sort-hint's hint warm start
    tokenizer = AutoTokenizer.from_pretrained(regime.warm_start)
    model = AutoModelForCausalLM.from_pretrained(regime.warm_start)
    final = regime.problems(job["final_prompts"], seed=HELDOUT_SEED)
    curve = regime.problems(job["curve_prompts"], seed=HELDOUT_SEED)
    calibration = calibrate(model, tokenizer, final, job.get("calibration_samples", 8))
    result = {
        "regime": job["regime"],
        "final": calibration["sampled"],
        "curve0": curve_point(evaluate(model, tokenizer, curve, 8)),
        # the judge's distance and coverage (`judge_calibration`), per notation its MInTRL arms use
        "judge": {
            notation: judge_calibration(
                model,
                tokenizer,
                final,
                notation=notation,
                reviewed_tokens=16 * regime.max_reviews,  # rl_config's chunk_size x the regime's max_reviews
                n_samples=job.get("judge_samples", 8),
                max_new_tokens=regime.max_completion_length,
            )
            for notation in _judge_notations(job["regime"])
        },
    }
    if "familiar" in calibration:
        result["familiar"] = calibration["familiar"]
    return result


def _judge_notations(regime_name: str) -> list[str]:
    """The rule judge's notations a regime's calibration measures: its own, and the far one where its arms also run a
    far judge (out-of-reach) — with no new operator the two write the same steps."""
    from benchmarks.tasks.toy.training import REGIMES

    regime = REGIMES[regime_name]
    if not regime.new_op:
        return [regime.judge_notation]
    return list(dict.fromkeys([regime.judge_notation, "near", "far"]))


def common_job_fields(settings: dict) -> dict:
    """The fields every job of a mode shares: steps, evaluation sets, prompts per step, curve spacing."""
    return {k: settings[k] for k in ("steps", "curve_prompts", "final_prompts", "prompts_per_step")} | {
        "eval_every": max(1, settings["steps"] // settings["curve_points"])
    }


def main_job(settings: dict, regime: str, label: str, method: str, overrides: dict, seed: int) -> dict:
    """One main-group job: `label` (trained by `method` with config `overrides`) on `regime` at `seed`, with the
    mode's common fields; other benchmarks build their arms with it so that their runs are learning.py's."""
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


def plan_jobs(settings: dict, parts: list[str] | None = None) -> list[dict]:
    """One job per (regime, label, seed), then the sweep's extra points, in plan order; with `parts` (full mode), only
    the regimes (and the sweep) of those `PARTS`."""
    common = common_job_fields(settings)
    scope, sweep = _part_scope(settings, parts)
    jobs = []
    for regime, labels in scope.items():
        seeds = settings["seeds"][: settings["seeds_per_regime"].get(regime, len(settings["seeds"]))]
        for seed in seeds:
            for label in labels:
                jobs.append(main_job(settings, regime, label, *LABELS[label], seed))
    for seed in settings["seeds"][: settings["sweep_seeds"] if sweep else 0]:
        for point, spec in SWEEP.items():
            if spec is None:
                continue
            jobs.append(
                dict(
                    common,
                    eval_every=settings["steps"] + 1,  # final scores only
                    name=f"{SWEEP_REGIME}-sweep-{point}-s{seed}",
                    group="sweep",
                    regime=SWEEP_REGIME,
                    label=f"sweep:{point}",
                    point=point,
                    method="mintrl-const",
                    seed=seed,
                    **spec,
                )
            )
    return jobs


def _part_scope(settings: dict, parts: list[str] | None) -> tuple[dict[str, list[str]], bool]:
    """The labels per regime and whether the sweep run: everything planned without `parts`, else the parts'."""
    if not parts:
        return dict(settings["plan"]), True
    scope: dict[str, list[str]] = {}
    for part in parts:
        for regime, labels in PARTS[part]["regimes"].items():
            scope[regime] = list(dict.fromkeys(scope.get(regime, []) + (labels or settings["plan"][regime])))
    return scope, any(PARTS[part]["sweep"] for part in parts)


def merge_previous(results: dict, previous: dict, parts: list[str]) -> dict:
    """`results` (a part's fresh run) with every record of `previous` (learning.json before it) that the parts do not
    rerun: other arms' runs, other regimes' calibrations, and the sweep unless a part reruns it. Each regime's
    calibration keeps the provenance of the last run that wrote it (`regime_provenance`), each arm (regime and
    label) that of the run that wrote its runs (`arm_provenance`; a file without them: its top-level provenance)."""
    scope, sweep = _part_scope(results["settings"], parts)

    seeds = set(results["settings"]["seeds"])

    def kept(run: dict) -> bool:
        if run.get("group") == "sweep":  # a sweep of another regime is the previous design's: in git history
            return not sweep and run["regime"] == SWEEP_REGIME
        # a part reruns its arms at the design seeds; runs merged from reproduce.py at other seeds stay
        return run["label"] not in scope.get(run["regime"], []) or run["seed"] not in seeds

    old_provenance = previous.get("regime_provenance") or {
        b["regime"]: previous["provenance"] for b in previous["baselines"]
    }
    results["baselines"] = [b for b in previous["baselines"] if b["regime"] not in scope] + results["baselines"]
    kept_runs = [r for r in previous["runs"] if kept(r)]
    results["arm_provenance"] = {
        **{arm_key(r): arm_provenance(previous, r["regime"], r["label"]) for r in kept_runs},
        **results.get("arm_provenance", {}),
    }
    results["runs"] = kept_runs + results["runs"]
    results["regime_provenance"] = {**old_provenance, **{r: results["provenance"] for r in scope}}
    if not sweep and previous["settings"].get("sweep", {}).get("regime") == SWEEP_REGIME:
        results["settings"]["sweep"] = previous["settings"]["sweep"]
    return results


# ----------------------------------------------------------------------------------------------------------- report


def split_recorded(jobs: list[dict], learning_results: dict | None) -> tuple[list[dict], list[dict], dict]:
    """(jobs to run, `learning_results`' runs of the other jobs, their arms' provenance): a recorded run is used when
    every field of the job another benchmark would build is the run's (the same job: runs are deterministic)."""
    if learning_results is None:
        return jobs, [], {}
    to_run, recorded, prov = [], [], {}
    for job in jobs:
        match = find_record(job, runs_of(learning_results, job["regime"], job["label"]))
        if match is not None:
            recorded.append(match)
            prov[arm_key(match)] = arm_provenance(learning_results, job["regime"], job["label"])
        else:
            to_run.append(job)
    return to_run, recorded, prov


final_by_seed = by_seed  # seed -> final score: final_by_seed(runs, "pass@8")


def log_mean(run: dict, key: str, intervention_phase: bool = False) -> float | None:
    until = _interv_steps(run) if intervention_phase else None
    values = [e[key] for e in run["logs"] if key in e and (until is None or e["step"] <= until)]
    return statistics.fmean(values) if values else None


def _interv_steps(run: dict) -> int:
    return run["overrides"].get("intervention_steps", phase_end_step(run["steps"]))


def phase_end_step(steps: int) -> int:
    """The default intervention phase's last step (`rl_config`: 40% of the steps, as the paper's 200 of 500): every
    arm's held-out scores are taken there too, and the lower-rate arms lower it from there."""
    return max(1, int(0.4 * steps))


def arm_key(run: dict) -> str:
    return f"{run['regime']}:{run['label']}"


def arm_provenance(results: dict, regime: str, label: str) -> dict:
    """The command and commit that wrote the runs of `label` on `regime` (a part may rerun only some of a regime's
    arms); a file from before `arm_provenance`: its regime's, else its top-level provenance."""
    by_arm = results.get("arm_provenance") or {}
    by_regime = results.get("regime_provenance") or {}
    return by_arm.get(f"{regime}:{label}") or by_regime.get(regime) or results["provenance"]


def runs_of(results: dict, regime: str, label: str) -> list[dict]:
    return select(results["runs"], regime=regime, label=label)


def sweep_runs(results: dict, point: str) -> list[dict]:
    sweep = sweep_settings(results)
    main = {**SWEEP_MAIN, "default": sweep["default"]}
    return runs_of(results, sweep["regime"], main.get(point, f"sweep:{point}"))


def sweep_settings(results: dict) -> dict:
    """The sweep's regime, judge notation and main-run label for its "default" point, as `normalise` set them
    (this version's SWEEP_REGIME, near judge and SWEEP_MAIN when absent)."""
    return results["settings"].get(
        "sweep", {"regime": SWEEP_REGIME, "judge": "near", "default": SWEEP_MAIN["default"]}
    )


CALIBRATION_KEYS = ("pass@1", "pass@8", "pass@64")


def _as_point(value) -> dict:
    """A curve point: the previous version recorded a float, held-out pass@1 only (no pass@8 to invent)."""
    return value if isinstance(value, dict) else {"pass@1": value}


def normalise(results: dict) -> dict:
    """`results` (learning.json's content) in this version's shape, as a copy; records written by the previous
    version (24 steps, regimes unreachable / reachable) read as well: their float curve points and float `curve0` are
    pass@1 only (pass@8 points stay missing; tables and plots skip them), a missing calibration entry (pass@64) is
    reported as "not recorded" by `calibration_text`, and the sweep's regime, judge and "default" run are taken from
    the sweep runs themselves (there: unreachable, the unsuffixed = far judge, mintrl-const)."""
    results = copy.deepcopy(results)
    for run in results["runs"]:
        run["curve"] = {step: _as_point(v) for step, v in run["curve"].items()}
    for base in results["baselines"]:
        if "curve0" in base:
            base["curve0"] = _as_point(base["curve0"])
    settings = results["settings"]
    if "sweep" not in settings:
        sweep = [r for r in results["runs"] if r.get("group") == "sweep"]
        regime = sweep[0]["regime"] if sweep else SWEEP_REGIME
        judge = sweep[0]["overrides"].get("_judge_notation", _default_notation(regime)) if sweep else "near"
        default = (
            SWEEP_MAIN["default"] if SWEEP_MAIN["default"] in settings["plan"].get(regime, []) else "mintrl-const"
        )
        settings["sweep"] = {"regime": regime, "judge": judge, "default": default}
    return results


def _default_notation(regime_name: str) -> str:
    """The rule judge's notation of a regime's runs without `_judge_notation`: the regime's own; the previous
    version's regimes (no longer defined) used the far judge."""
    from benchmarks.tasks.toy.training import REGIMES

    return REGIMES[regime_name].judge_notation if regime_name in REGIMES else "far"


def _provenance_text(prov: dict) -> str:
    changed = prov["changed_files_that_matter"]
    differed = f" (files under benchmarks/ or trl_mintrl/ differed: {', '.join(changed)})" if changed else ""
    return f"`{prov['command']}` at commit `{prov['commit'][:12]}`{differed}"


def run_provenance(results: dict, run: dict) -> dict:
    """The command and commit that wrote `run`: its own (a run merged from `benchmarks/studies/reproduce.py` at a fresh
    seed, or any run the harness recorded), else its arm's."""
    return run.get("provenance") or record_provenance(run) or arm_provenance(results, run["regime"], run["label"])


def provenance_lines(results: dict) -> list[str]:
    """Which command and commit wrote each regime's runs (one line per distinct run; a regime whose arms were
    written by several runs names its arms, and the seeds where an arm's runs came from several)."""
    groups: dict[str, list[str]] = {}
    for regime in results["settings"]["plan"]:
        by_text: dict[str, dict[str, list[int]]] = {}
        for run in sorted((r for r in results["runs"] if r["regime"] == regime), key=lambda r: r["seed"]):
            text = _provenance_text(run_provenance(results, run))
            by_text.setdefault(text, {}).setdefault(run["label"], []).append(run["seed"])
        all_seeds = {r["seed"] for r in results["runs"] if r["regime"] == regime}
        for text, arms in by_text.items():
            seeds = sorted({seed for arm_seeds in arms.values() for seed in arm_seeds})
            which = "" if set(seeds) == all_seeds else f", seeds {', '.join(map(str, seeds))}"
            groups.setdefault(text, []).append(regime if len(by_text) == 1 else f"{regime} ({', '.join(arms)}{which})")
    return [f"- {'; '.join(regimes)}: {text}" for text, regimes in groups.items()]


def report(results: dict) -> str:
    settings = results["settings"]
    lines = [
        "# Learning benchmark (written by benchmarks/studies/learning.py from learning.json; do not edit)",
        "",
        f"{settings['steps']} optimizer steps x {settings['prompts_per_step']} prompts x 8 rollouts (grpo-2x: 16), "
        f"held-out {settings['final_prompts']} problems x 8 samples at temperature 1. Values in %: mean ± std over "
        "seeds; differences to GRPO are paired by seed, with a 95% t-interval; **resolved** = the interval excludes 0.",
        "",
        "Written by:",
        *provenance_lines(results),
        "",
        "## Calibration: where each regime stands against MInTRL's two preconditions",
        "",
        *calibration_table(results),
    ]
    for regime, labels in settings["plan"].items():
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        grpo = runs_of(results, regime, "grpo")
        lines += ["", f"## Regime: {regime}", ""]
        if base is not None:
            lines += [f"Calibration: {calibration_text(base)}.", ""]
        peaks = [[p["pass@8"] for p in r["curve"].values() if "pass@8" in p] for r in grpo]
        if any(peaks):  # records of the previous version have pass@1 curves only
            text = ", ".join(f"{100 * max(p):.1f}" if p else "-" for p in peaks)
            lines += [f"GRPO's highest held-out pass@8 on the curve set over the run, per seed: {text}.", ""]
            lines += [
                f"GRPO's curve (curve set, mean over seeds, pass@1 / pass@8 by step): {_mean_curve(grpo, base)}.",
                "",
            ]
        lines += [
            "| method | seeds | pass@1 | pass@8 | pass@1 - GRPO [95% CI] | resolved | pass@8 - GRPO [95% CI] "
            "| judge-token share | reward interv. - control | judge-token NLL | not-absorbed warning | train s/run |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for label in labels:
            runs = runs_of(results, regime, label)
            if not runs:
                lines.append(f"| {label} | 0 | (not run yet) |||||||||")
                continue
            diff1 = paired_difference(final_by_seed(runs), final_by_seed(grpo)) if label != "grpo" else None
            diff8 = paired_difference(final_by_seed(runs, "pass@8"), final_by_seed(grpo, "pass@8"))
            cells = []
            for key in ("mintrl/judge_token_frac", "mintrl/reward_gap"):
                values = [v for r in runs if (v := log_mean(r, key, intervention_phase=True)) is not None]
                cells.append(format_mean_std(values))
            nll = [v for r in runs if (v := log_mean(r, "mintrl/judge_token_nll", True)) is not None]
            cells.append(f"{statistics.fmean(nll):.2f}" if nll else "-")
            warned = [w for r in runs if (w := not_absorbed_warning(r)) is not None]
            cells.append(f"{sum(warned)} of {len(warned)} seeds" if warned else "-")
            lines.append(
                f"| {label} | {len(runs)} | {format_mean_std([r['final']['pass@1'] for r in runs])} "
                f"| {format_mean_std([r['final']['pass@8'] for r in runs])} | {format_interval(diff1)} "
                f"| {verdict_cell(diff1)} | {format_interval(diff8) if label != 'grpo' else '-'} "
                f"| {' | '.join(cells)} "
                f"| {statistics.fmean(r['train_seconds'] for r in runs):.0f} |"
            )
        lines += retention_table(results, regime, labels)
    lines += distance_table(results)
    points, sweep = sweep_table(results), sweep_settings(results)
    if points:
        lines += [
            "",
            f"## Intervention intensity (MInTRL-const with the {sweep['judge']} judge, {sweep['regime']} regime)",
            "",
            "Judge-token share = judge tokens / completion tokens during the intervention phase. Gains are paired by "
            "seed against the same trainer without interventions (mintrl-off) and against GRPO.",
            "",
            "| point | settings | seeds | judge-token share | pass@1 | gain over no intervention [95% CI] "
            "| pass@1 - GRPO [95% CI] |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in points:
            lines.append(
                f"| {p['point']} | {p['settings']} | {p['n']} | {format_mean_std(p['share'])} "
                f"| {format_mean_std(p['p1'])} | {format_interval(p['gain'])} | {format_interval(p['vs_grpo'])} |"
            )
        best = max(points, key=lambda p: statistics.fmean(p["p1"]))
        lines += ["", f"Highest mean pass@1: {best['point']} ({format_mean_std(best['share'])}% judge tokens)."]
    wall = results.get("wall_seconds")
    lines += [
        "",
        f"{len(results['runs'])} runs" + (f"; the last run's wall time {wall / 60:.1f} min" if wall else "") + ".",
    ]
    return "\n".join(lines) + "\n"


README_START, README_END = markers("benchmarks/studies/learning.py", "learning-results")


README_REGIMES = ["in-band", "out-of-reach", "reachable", "sort-hint"]  # summary block's columns; distance: a line
# the summary block's rows (the retention and notation variants are in learning.md), those with runs
README_LABELS = ["grpo", "grpo-2x", "mintrl-const", "mintrl-const-full", "mintrl-const-near", "mintrl-const-far",
                 "mintrl-proxy", "mintrl-off", "sort", "sort-uniform", "sort-shared", "sort-beta0", "sort-beta1"]  # fmt: skip


def readme_block(results: dict) -> str:
    """The summary block (docs/benchmarks.md), compact: per main regime, each method's pass@1 difference to GRPO;
    the calibrations, the judge's distance and the intensity sweep in a line each. The full tables: learning.md."""
    results = normalise(results)
    settings = results["settings"]
    regimes = [r for r in README_REGIMES if r in settings["plan"] and runs_of(results, r, "grpo")]
    commits = sorted({run_provenance(results, r)["commit"][:12] for r in results["runs"]})
    lines = [
        f"{settings['steps']} optimizer steps; held-out pass@1 in %, difference to GRPO paired by seed with a 95% "
        f"t-interval (**bold**: resolved). From `benchmarks/results/learning.json` (commits {', '.join(commits)}); "
        "every arm, pass@8, retention and calibration in `benchmarks/results/learning.md`.",
        "",
        "| method | " + " | ".join(f"{r} ({len(runs_of(results, r, 'grpo'))} seeds)" for r in regimes) + " |",
        "|---|" + "---|" * len(regimes),
    ]
    planned = {label for r in regimes for label in settings["plan"][r] if runs_of(results, r, label)}
    for label in (label for label in README_LABELS if label in planned):
        cells = []
        for regime in regimes:
            runs, grpo = runs_of(results, regime, label), runs_of(results, regime, "grpo")
            if not runs:
                cells.append("")
            elif label == "grpo":
                cells.append(format_mean_std([r["final"]["pass@1"] for r in runs]))
            else:
                diff = paired_difference(final_by_seed(runs), final_by_seed(grpo))
                text = format_interval(diff)
                text = f"**{text}**" if diff.resolved else text
                cells.append(text if diff.n == len(grpo) else f"{text} ({diff.n} seeds)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    calibrations = []
    for regime in regimes:
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        if base is not None and "pass@64" in base["final"]:
            judge = base.get("judge", {})
            j = judge.get("near") or judge.get("far")
            nats = f", corrections {j['correction_nats']:.1f} nats" if j else ""
            calibrations.append(
                f"{regime} pass@8 {100 * base['final']['pass@8']:.1f}%, pass@64 {100 * base['final']['pass@64']:.1f}%"
                f"{nats} ({precondition(base, 'near' if 'near' in judge else 'far')})"
            )
    if calibrations:
        lines += ["", "Warm start: " + "; ".join(calibrations) + "."]
    points = distance_points(results)
    if points:
        lines += [
            "",
            "Judge's distance (MInTRL-const - GRPO, pass@1, by the corrections' NLL under the warm start): "
            + "; ".join(f"{p['nats']:.1f} nats {format_interval(p['diff1'])}" for p in points)
            + ".",
        ]
    sweep_points, sweep = sweep_table(results), sweep_settings(results)
    if sweep_points:
        gains = ", ".join(
            f"{p['point']} {format_mean_std(p['share'])}%: {format_interval(p['gain'])}" for p in sweep_points
        )
        lines += ["", f"Intensity ({sweep['regime']}, judge-token share: pass@1 gain over no intervention): {gains}."]
    return "\n".join(lines)


BAND_PASS8, BAND_PASS64, BAND_NATS = 0.01, 0.05, 7.0  # issue 27: outside the inference support, inside training's


def precondition(base: dict, notation: str = "near") -> str:
    """Whether a regime's warm start meets MInTRL's two preconditions: outside the inference support (pass@8 <= 1%,
    pass@64 <= 5%) and inside the training support (`correction_nats` <= 7 with the `notation` judge)."""
    final, judge = base["final"], base.get("judge", {}).get(notation)
    if judge is None or "pass@64" not in final:
        return "not measured"
    misses = []
    if final["pass@8"] > BAND_PASS8 or final["pass@64"] > BAND_PASS64:
        misses.append("within sampling's reach")
    if not judge["correction_nats"] <= BAND_NATS:
        misses.append("corrections too far")
    return "in band" if not misses else "fails: " + ", ".join(misses)


def calibration_table(results: dict) -> list[str]:
    """Every regime's warm start: pass@k, the judge's distance (`correction_nats`, per notation) and coverage, and
    the precondition verdict with the near judge (the notation of the in-band family)."""
    lines = [
        "Warm start on the held-out problems (pass@k in %, 64 samples); `correction_nats`: mean ± std NLL of the "
        "rule judge's corrections under the warm start (summed over a correction's tokens) on its own rollouts, the "
        "whole completion reviewed; coverage: share of corrected wrong steps inside the reviewed chunks (the regime's "
        f"max_reviews x 16 tokens). In band: pass@8 <= {100 * BAND_PASS8:.0f}%, pass@64 <= {100 * BAND_PASS64:.0f}% "
        f"and near corrections <= {BAND_NATS:.0f} nats.",
        "",
        "| regime | pass@1 | pass@8 | pass@64 | correction_nats, near judge | far judge | corrected rollouts | coverage "
        "| preconditions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for regime in results["settings"]["plan"]:
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        if base is None:
            continue
        final, judge = base["final"], base.get("judge", {})
        cells = [f"{100 * final[k]:.2f}" if k in final else "-" for k in ("pass@1", "pass@8", "pass@64")]
        for notation in ("near", "far"):
            j = judge.get(notation) or (judge.get("far") if notation == "near" and not _has_new_op(regime) else None)
            cells.append(f"{j['correction_nats']:.1f} ± {j['correction_nats_std']:.1f}" if j else "-")
        j = judge.get("near") or judge.get("far")
        cells += [f"{100 * j['corrected_share']:.0f}%", f"{100 * j['coverage']:.0f}%"] if j else ["-", "-"]
        cells.append(precondition(base, "near" if "near" in judge else "far"))
        lines.append(f"| {regime} | " + " | ".join(cells) + " |")
    return lines


def _has_new_op(regime: str) -> bool:
    from benchmarks.tasks.toy.training import REGIMES

    return bool(REGIMES[regime].new_op) if regime in REGIMES else True


def not_absorbed_warning(run: dict) -> bool | None:
    """Whether the trainer's not-absorbed warning fired in a MInTRL run (None for other methods): from the logged
    `mintrl/corrections_not_absorbed`, or, in records from before it was logged, by replaying the logged judge-token
    NLL of each step through the trainer's own `AbsorptionTracker` with MInTRLConfig's defaults."""
    if not run.get("method", "").startswith("mintrl"):
        return None
    flags = [e["mintrl/corrections_not_absorbed"] for e in run["logs"] if "mintrl/corrections_not_absorbed" in e]
    if flags:
        return any(flags)
    from trl_mintrl.mintrl.absorption import AbsorptionTracker
    from trl_mintrl.mintrl.config import MInTRLConfig

    defaults = {f.name: f.default for f in MInTRLConfig.__dataclass_fields__.values()}
    tracker = AbsorptionTracker(
        defaults["absorption_window"], defaults["absorption_max_nll"], defaults["absorption_min_fall"]
    )
    for entry in run["logs"]:
        if "mintrl/judge_token_nll" in entry:
            _, warn = tracker.update(entry["step"], entry["mintrl/judge_token_nll"], 1.0)
            if warn:
                return True
    return False


def retention_table(results: dict, regime: str, labels: list[str]) -> list[str]:
    """Held-out scores at the end of the intervention phase, at the end of the run and at the step the validation
    set selected, per arm, each paired against GRPO at the same point (runs that recorded them)."""
    grpo = [r for r in runs_of(results, regime, "grpo") if r.get("phase_end")]
    rows = [(label, [r for r in runs_of(results, regime, label) if r.get("phase_end")]) for label in labels]
    rows = [(label, runs) for label, runs in rows if runs]
    if not rows:
        return []
    step = rows[0][1][0]["phase_end"]["step"]
    lines = [
        "",
        f"Retention: held-out pass@1 / pass@8 at the end of the intervention phase (step {step}), at the end of the "
        "run, and at the step a validation set (other problems) selects among the curve points and the phase end "
        "(steps chosen per seed); differences to GRPO at the same point, paired by seed.",
        "",
        "| method | phase end | end | validation-selected (steps) | phase end - GRPO: pass@1 | pass@8 "
        "| selected - GRPO: pass@1 | pass@8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, runs in rows:
        point = lambda key, k, runs=runs: {r["seed"]: r[key][k] for r in runs}  # noqa: E731
        grpo_point = lambda key, k: {r["seed"]: r[key][k] for r in grpo}  # noqa: E731
        cells = [
            " / ".join(format_mean_std(list(point(key, k).values())) for k in ("pass@1", "pass@8"))
            for key in ("phase_end", "final", "selected")
        ]
        cells[2] += f" ({', '.join(str(r['selected']['step']) for r in runs)})"
        for key in ("phase_end", "selected"):
            for k in ("pass@1", "pass@8"):
                diff = None if label == "grpo" else paired_difference(point(key, k), grpo_point(key, k))
                cells.append(format_interval(diff) if diff else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def distance_points(results: dict) -> list[dict]:
    """The judge's distance sweep: per regime of the in-band family with both arms run, its near `correction_nats`
    and MInTRL-const - GRPO (pass@1 and pass@8, paired by seed)."""
    from benchmarks.tasks.toy.task import OFFSETS
    from benchmarks.tasks.toy.training import REGIMES

    points = []
    for regime in DISTANCE_REGIMES:
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        grpo, mintrl = runs_of(results, regime, "grpo"), runs_of(results, regime, "mintrl-const")
        if base is None or "near" not in base.get("judge", {}) or not grpo or not mintrl:
            continue
        points.append(
            {
                "regime": regime,
                "k": OFFSETS[REGIMES[regime].new_op],
                "nats": base["judge"]["near"]["correction_nats"],
                "base": base,
                "grpo": [r["final"]["pass@1"] for r in grpo],
                "mintrl": [r["final"]["pass@1"] for r in mintrl],
                "diff1": paired_difference(final_by_seed(mintrl), final_by_seed(grpo)),
                "diff8": paired_difference(final_by_seed(mintrl, "pass@8"), final_by_seed(grpo, "pass@8")),
            }
        )
    return sorted(points, key=lambda p: p["nats"])


def distance_table(results: dict) -> list[str]:
    points = distance_points(results)
    if not points:
        return []
    lines = [
        "",
        "## The judge's distance (MInTRL-const vs GRPO on the in-band design, the rule `a+b+k` moved)",
        "",
        "| regime | k | correction_nats | warm start pass@8 / pass@64 | preconditions | seeds | GRPO pass@1 "
        "| MInTRL-const pass@1 | pass@1 difference [95% CI] | pass@8 difference [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        final = {k: f"{100 * v:.2f}" for k, v in p["base"]["final"].items()}
        lines.append(
            f"| {p['regime']} | {p['k']:+d} | {p['nats']:.1f} | {final.get('pass@8', '-')} / "
            f"{final.get('pass@64', '-')} | {precondition(p['base'])} | {p['diff1'].n} | {format_mean_std(p['grpo'])} "
            f"| {format_mean_std(p['mintrl'])} | {format_interval(p['diff1'])} | {format_interval(p['diff8'])} |"
        )
    return lines


def calibration_text(base: dict) -> str:
    """The warm start's pass@k on a regime's held-out problems, and in familiar notation where it has a new
    operator."""
    keys = [*CALIBRATION_KEYS, *(k for k in base["final"] if k.startswith("pass@") and k not in CALIBRATION_KEYS)]
    sampled = ", ".join(
        f"{k} {100 * base['final'][k]:.1f}" if k in base["final"] else f"{k} not recorded" for k in keys
    )
    text = f"warm start {sampled}"
    if "familiar" in base:
        text += (
            f"; the same problems in familiar notation (`a#b` as `a+(b+2)`, `a@b` as `a-(7-b)`): pass@1 "
            f"{100 * base['familiar']['pass@1']:.1f}, pass@8 {100 * base['familiar']['pass@8']:.1f}"
        )
    return text


def _mean_curve(runs: list[dict], base: dict | None) -> str:
    """`step: pass@1 / pass@8` in % at every curve point all runs share, from step 0 (the warm start's `curve0`)."""
    steps = sorted(set.intersection(*(set(r["curve"]) for r in runs)), key=int)
    start = base.get("curve0") if base else None
    points = [] if start is None else [f"0: {100 * start['pass@1']:.1f} / {100 * start['pass@8']:.1f}"]
    for step in steps:
        p1, p8 = (statistics.fmean(r["curve"][step][k] for r in runs) for k in ("pass@1", "pass@8"))
        points.append(f"{step}: {100 * p1:.1f} / {100 * p8:.1f}")
    return ", ".join(points)


def sweep_table(results: dict) -> list[dict]:
    regime = sweep_settings(results)["regime"]
    if regime not in results["settings"]["plan"]:
        return []
    grpo = final_by_seed(runs_of(results, regime, "grpo"))
    off = final_by_seed(runs_of(results, regime, "mintrl-off"))
    sweep_seeds = set(results["settings"]["seeds"][: results["settings"]["sweep_seeds"]])
    points = []
    for point, spec in SWEEP.items():
        runs = [r for r in sweep_runs(results, point) if r["seed"] in sweep_seeds]
        if not runs or not sweep_seeds:
            continue
        p1 = final_by_seed(runs)
        overrides = {k: v for k, v in (spec["overrides"] if spec else {}).items() if not k.startswith("_")}
        settings = "intervention_steps=0" if point == "off" else json.dumps(overrides)  # the judge: in the heading
        if spec is not None and spec["judge_steps"] > 1:
            settings += f", judge writes {spec['judge_steps']} steps"
        if spec is not None and spec.get("judge_from_start"):
            settings += ", from the first step of every intervened rollout"
        points.append(
            {
                "point": point,
                "settings": "the regime's defaults (1 step per correction)" if point == "default" else settings,
                "n": len(runs),
                "share": [log_mean(r, "mintrl/judge_token_frac", True) or 0.0 for r in runs],
                "p1": list(p1.values()),
                "gain": paired_difference(p1, off),
                "vs_grpo": paired_difference(p1, grpo),
            }
        )
    return points


# ------------------------------------------------------------------------------------------------------------ plots


def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = results["settings"]
    regimes = list(settings["plan"])
    paths = []

    fig, axes = plt.subplots(len(regimes), 2, figsize=(13, 4.2 * len(regimes)), squeeze=False)
    for row, regime in zip(axes, regimes, strict=True):
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        for ax, k in zip(row, ("pass@1", "pass@8"), strict=True):
            drawn = False
            for n, label in enumerate(settings["plan"][regime]):
                runs = runs_of(results, regime, label)
                if not runs:
                    continue
                per_step = {
                    int(s): [r["curve"][s][k] for r in runs if k in r["curve"].get(s, {})]
                    for s in {s for r in runs for s in r["curve"]}
                }
                if base is not None and k in base.get("curve0", {}):
                    per_step[0] = [base["curve0"][k]]
                steps = sorted(s for s, values in per_step.items() if values)  # old records: no pass@8 points
                if not steps:
                    continue
                per_step = [per_step[s] for s in steps]
                _mean_band(ax, steps, per_step, f"C{n % 10}", label, "--" if "grpo" in label else "-")
                drawn = True
            ax.set_xlabel("optimizer step")
            ax.set_ylabel(f"held-out {k} (%), {settings['curve_prompts']} problems")
            ax.set_title(f"{regime}: mean over seeds, band = 95% t-interval")
            if drawn:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, f"no {k} curve points recorded", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    paths.append(out / "learning_curves.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    panels = [
        ("reward", "training reward (controls for MInTRL)", ("mintrl/reward_control", "reward")),
        ("intervened", "reward of intervened rollouts", ("mintrl/reward_intervened",)),
        ("nll", "judge-token NLL under the policy (nats)", ("mintrl/judge_token_nll",)),
        ("entropy", "policy entropy on completion tokens (nats)", ("entropy",)),
        ("sort", "SORT mean repair weight", ("sort/mean_weight",)),
    ]
    fig, axes = plt.subplots(len(regimes), len(panels), figsize=(4.2 * len(panels), 3.4 * len(regimes)), squeeze=False)
    for row, regime in zip(axes, regimes, strict=True):
        for ax, (_, title, keys) in zip(row, panels, strict=True):
            for n, label in enumerate(settings["plan"][regime]):
                by_step: dict[int, list[float]] = {}
                for run in runs_of(results, regime, label):
                    for entry in run["logs"]:
                        key = next((k for k in keys if k in entry), None)
                        if key is not None:
                            by_step.setdefault(entry["step"], []).append(entry[key])
                if by_step:
                    xs = sorted(by_step)
                    style = "--" if "grpo" in label else "-"
                    _mean_band(ax, xs, [by_step[x] for x in xs], f"C{n % 10}", label, style, 1)
            ax.set_title(f"{regime}: {title}", fontsize=9)
            ax.set_xlabel("optimizer step")
            ax.legend(fontsize=6)
    fig.tight_layout()
    paths.append(out / "learning_interventions.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    points = sweep_table(results)
    if points:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        xs = [100 * statistics.fmean(p["share"]) for p in points]
        ys = _interval_errorbar(ax, xs, [p["gain"] or mean_interval([0.0]) for p in points])
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(p["point"], (x, y), fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("judge-token share (%, intervention phase)")
        ax.set_ylabel("pass@1 gain over no intervention (points)")
        ax.set_title(f"Intervention intensity (near judge), {SWEEP_REGIME} (95% t-interval)")
        fig.tight_layout()
        paths.append(out / "learning_sweep.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    distance = distance_points(results)
    if distance:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for n, key in enumerate(("diff1", "diff8")):
            xs = [p["nats"] + 0.08 * n for p in distance]
            _interval_errorbar(ax, xs, [p[key] for p in distance], label=key.replace("diff", "pass@"))
        for p in distance:
            ax.annotate(f"k={p['k']:+d}", (p["nats"], 100 * p["diff1"].mean), fontsize=8, xytext=(4, 4),
                        textcoords="offset points")  # fmt: skip
        ax.axhline(0, color="grey", lw=0.8)
        ax.axvline(BAND_NATS, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("correction_nats: NLL of the judge's corrections under the warm start")
        ax.set_ylabel("MInTRL-const - GRPO (points)")
        ax.set_title("The judge's distance (95% t-interval over seeds)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "learning_distance.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def _interval_errorbar(ax, xs, intervals, **kwargs) -> list[float]:
    """Means with their 95% intervals as error bars, in points (no bar where an interval has no bounds); returns
    the plotted means."""
    ys = [100 * i.mean for i in intervals]
    err = [
        [100 * (i.mean - i.low) if i.low is not None else 0 for i in intervals],
        [100 * (i.high - i.mean) if i.high is not None else 0 for i in intervals],
    ]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, **kwargs)
    return ys


def _mean_band(ax, xs, per_x, color, label, style, scale=100):
    means = [scale * statistics.fmean(v) for v in per_x]
    ax.plot(xs, means, style, color=color, label=label, marker="o" if scale == 100 else None, ms=3)
    if all(len(v) > 1 for v in per_x):
        intervals = [mean_interval(v) for v in per_x]
        ax.fill_between(
            xs, [scale * i.low for i in intervals], [scale * i.high for i in intervals], color=color, alpha=0.12
        )


# ------------------------------------------------------------------------------------------------------------- main


def render(results: dict, out: Path, plots: bool = True) -> str:
    """Write learning.md (and the PNGs) from `results`, the content of learning.json (either version's records)."""
    return harness.write_report(normalise(results), out, "learning.md", report, plot, plots)


CLI_MODES = {  # the flags of the modes besides full, the first given wins
    "smoke": "1 step, 2 prompts, 2 seeds, 2 methods (the test)",
    "quick": "1 seed, 6 steps, 4 arms on in-band, no sweep (~1.5 min on 2 idle cores)",
    "horizon": "GRPO alone, 96 steps, 3 seeds, every regime: when its curve flattens",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = harness.study_parser(__doc__, CLI_MODES, replot_help="re-render learning.md and plots from a JSON")
    parser.add_argument(
        "--part",
        nargs="+",
        choices=sorted(PARTS),
        default=None,
        help="full mode in parts: run only these parts' regimes (and the sweep) and merge them into the existing "
        "learning.json, keeping every other record",
    )
    parser.add_argument(
        "--recheck",
        nargs="+",
        metavar="REGIME:LABEL:SEED",
        default=None,
        help="rerun these runs of the output folder's learning.json at this checkout and compare their final "
        "pass@1 / pass@8 with the recorded ones (writes learning_recheck.json; exit status 1 if any differs)",
    )
    args = parser.parse_args(argv)
    load = lambda path: normalise(json.loads(path.read_text()))  # noqa: E731
    if harness.replot_from(args, render, readme_block, (README_START, README_END), load):
        return
    if args.recheck:
        sys.exit(0 if recheck(args.recheck, args.out or RESULTS, argv, args.workers) else 1)
    mode = harness.mode_of(args, CLI_MODES)
    out = args.out or (RESULTS if mode == "full" else RESULTS / mode)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"mode": mode, **MODES[mode]}
    results = harness.new_results("benchmarks/studies/learning.py", argv, settings)
    parts = args.part if mode == "full" else None
    if parts and (out / "learning.json").exists():
        results = merge_previous(results, load(out / "learning.json"), parts)
    jobs = plan_jobs(settings, parts)
    base_jobs = [
        {"regime": r, **{k: settings[k] for k in ("final_prompts", "curve_prompts", "calibration_samples")}}
        for r in _part_scope(settings, parts)[0]
    ]
    baselines = [(baseline, job) for job in base_jobs]
    execute(results, out, "learning.json", render, baselines, run_job, jobs, args.workers, args.resume)


def recheck(keys: list[str], out: Path, argv: list[str], workers: int) -> bool:
    """Rerun the runs `keys` (`regime:label:seed`) of `out/learning.json` with its settings at this checkout and
    compare their final pass@1 / pass@8 with the recorded ones: the parts of a full run are written at different
    commits, and this shows whether the code since then changes them. Writes `out/learning_recheck.json`; True when
    every rerun matches."""
    prov = provenance("benchmarks/studies/learning.py", argv)  # the checkout the reruns start from
    results = normalise(json.loads((out / "learning.json").read_text()))
    plan = {(j["regime"], j["label"], str(j["seed"])): j for j in plan_jobs(results["settings"])}
    jobs = []
    for key in keys:
        if tuple(key.rsplit(":", 2)) not in plan:
            raise SystemExit(f"--recheck {key}: not a run of {out / 'learning.json'}'s plan (regime:label:seed)")
        jobs.append(plan[tuple(key.rsplit(":", 2))])
    tasks = [harness.Task(run_job, job) for job in jobs]
    outcomes = {outcome.task: outcome for outcome in harness.run_tasks(tasks, max(1, workers))}
    rows = []
    for task in tasks:
        job, rerun = task.job, outcomes[task].record
        if rerun is None:
            raise harness.JobsFailed(f"--recheck {job['name']}:\n{outcomes[task].error}")
        [recorded] = [r for r in runs_of(results, job["regime"], job["label"]) if r["seed"] == job["seed"]]
        scores = {k: (recorded["final"][k], rerun["final"][k]) for k in ("pass@1", "pass@8")}
        rows.append(
            {
                "run": job["name"],
                "recorded_at": arm_provenance(results, job["regime"], job["label"])["commit"],
                "recorded": {k: v[0] for k, v in scores.items()},
                "rerun": {k: v[1] for k, v in scores.items()},
                "same": all(a == b for a, b in scores.values()),
            }
        )
        print(
            f"{job['name']} (recorded at {rows[-1]['recorded_at'][:7]}): pass@1 / pass@8 "
            f"{100 * scores['pass@1'][0]:.2f} / {100 * scores['pass@8'][0]:.2f} recorded, "
            f"{100 * scores['pass@1'][1]:.2f} / {100 * scores['pass@8'][1]:.2f} now: "
            f"{'same' if rows[-1]['same'] else 'DIFFERENT'}",
            flush=True,
        )
    report = {"provenance": prov, "runs": rows}
    (out / "learning_recheck.json").write_text(json.dumps(report, indent=1))
    return all(row["same"] for row in rows)


def execute(
    results: dict, out: Path, json_name: str, render_fn, baseline_jobs, run_fn, jobs, workers: int, resume=False
) -> None:
    """The toy studies' runner: `harness.execute` of the baselines (`(function, job)` pairs) and `run_fn` on every
    job, with each arm's provenance (`arm_provenance`) kept and a line per finished run."""
    harness.execute(results, out, json_name, jobs, run_fn, workers=workers, baselines=baseline_jobs,
                    render=render_fn, describe=describe_run, on_record=note_arm, resume=resume)  # fmt: skip


def note_arm(results: dict, collection: str, record: dict) -> None:
    """A run's arm (regime and label) was last written by the command and commit that recorded the run."""
    if collection == "runs":
        prov = record_provenance(record) or results["provenance"]
        results.setdefault("arm_provenance", {})[arm_key(record)] = prov


def describe_run(run: dict) -> str:
    return (
        f"{run['name']}: pass@1 {100 * run['final']['pass@1']:.1f} pass@8 {100 * run['final']['pass@8']:.1f} "
        f"({run['train_seconds']:.0f}s train)"
    )


if __name__ == "__main__":
    main()
