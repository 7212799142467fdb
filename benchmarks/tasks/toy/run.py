"""One learning run on the toy task, as a job the harness runs in a worker process: a (regime, label, seed) job
(`arms.main_job`) trained from its regime's warm start and scored on the held-out problems (`run_job`), the regime's
calibration at the warm start (`baseline`), and the runner the toy studies share (`execute`: the harness, with each
arm's provenance kept and a line per finished run)."""

from __future__ import annotations

import time
from pathlib import Path

from transformers import TrainerCallback

from benchmarks.lib import harness
from benchmarks.lib.harness import step_logs
from benchmarks.lib.records import arm_provenance, note_arm, runs_of

from .arms import LOGGED, job_judge, job_planner
from .training import HELDOUT_SEED, REGIMES, TRAIN_SEED, VALIDATION_SEED, phase_end_step


def curve_point(scores: dict) -> dict:
    return {k: scores[k] for k in ("pass@1", "pass@8")}


def run_job(job: dict, logged: tuple[str, ...] = LOGGED) -> dict:
    """Train one (regime, label, seed) run in this process; return its curve, final scores and logs (the `logged`
    metrics), its held-out scores at the end of the intervention phase (`phase_end`, every arm alike) and at the step
    a validation set selects (`selected`: weights kept in memory at every curve point and the phase end, the best
    validation pass@1 chosen, never the held-out set; ties go to the later step)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from .evaluate import evaluate, sample_completions, scores_of
    from .warm_start import sft_on_references

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
    watch = CurveWatch(job, tokenizer, final_problems, validation_problems, phase_end)
    sft, sft_seconds = job["overrides"].get("_sft_first"), 0.0
    if sft is not None:  # SFT on the references first (one epoch), then the method: its time counts as training
        start = time.perf_counter()
        sft_steps = sft_on_references(model, tokenizer, train, **sft)
        sft_seconds = time.perf_counter() - start
        sft_end = {**curve_point(evaluate(model, tokenizer, final_problems, 8)), "steps": sft_steps}
    trainer = job_trainer(job, model, tokenizer, train, watch, phase_end)
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start - watch.eval_seconds + sft_seconds
    # the curve set is a prefix of the held-out set: its last point comes from the final samples
    completions = sample_completions(trainer.model, tokenizer, final_problems, 8)
    final = scores_of(final_problems, completions, ks=(1, 8))
    watch.curve[job["steps"]] = curve_point(scores_of(curve_problems, completions[: len(curve_problems)]))
    return {
        **job,
        "final": final,
        "curve": watch.curve,
        "phase_end": watch.phase or None,
        "validation": watch.validation,
        "selected": watch.select(trainer.model, final),
        "logs": step_logs(trainer.state.log_history, logged),
        "train_seconds": train_seconds,
        **({"sft_end": sft_end} if sft is not None else {}),
    }


def job_trainer(job: dict, model, tokenizer, train, watch: TrainerCallback, phase_end: int):
    """The job's trainer: its method's config with the label's overrides (the `_` job settings applied), its rule
    judge and SORT planner, the curve callback and, for the retention arms, the lower later rate or the decaying
    judge-token share."""
    from .training import build_trainer, rl_config

    overrides = {k: v for k, v in job["overrides"].items() if not k.startswith("_")}
    if job["overrides"].get("_learned_judge"):
        from .learned_judge import judge_config_fields

        overrides |= judge_config_fields()
    rollouts = 8 * job["overrides"].get("_batch_factor", 1)
    overrides["per_device_train_batch_size"] = job["prompts_per_step"] * rollouts
    args = rl_config(job["method"], f"/tmp/trl_mintrl_bench/{job['name']}", steps=job["steps"], seed=job["seed"],
                     regime=job["regime"], **overrides)  # fmt: skip
    callbacks = [watch]
    if job["overrides"].get("_judge_share_decay"):
        callbacks.append(decaying_judge_share(phase_end))
    lower = job["overrides"].get("_on_policy_lr_factor")
    return build_trainer(job["method"], model, tokenizer, train, args, judge=job_judge(job), callbacks=callbacks,
                         reward=REGIMES[job["regime"]].reward, planner=job_planner(job),
                         schedule=None if lower is None else {"later_factor": lower, "later_from": phase_end})  # fmt: skip


class CurveWatch(TrainerCallback):
    """Held-out pass@1 / pass@8 every `eval_every` steps on the small curve set, on the whole held-out set at the end
    of the intervention phase, and validation scores with a copy of the weights at both (not counted in training
    time; sampling restores the torch RNG, so training is the same with or without them)."""

    def __init__(self, job: dict, tokenizer, final_problems, validation_problems, phase_end: int):
        self.job, self.tokenizer, self.phase_end = job, tokenizer, phase_end
        self.final_problems, self.validation_problems = final_problems, validation_problems
        self.curve_problems = final_problems[: job["curve_prompts"]]
        self.curve, self.validation, self.snapshots, self.phase, self.eval_seconds = {}, {}, {}, {}, 0.0

    def on_step_end(self, args, state, control, model=None, **kwargs):
        from .evaluate import evaluate

        step, steps = state.global_step, self.job["steps"]
        on_curve = step % self.job["eval_every"] == 0 and step < steps
        if not (on_curve or step == self.phase_end):
            return
        start = time.perf_counter()
        if on_curve:
            self.curve[step] = curve_point(evaluate(model, self.tokenizer, self.curve_problems, 8))
        if step == self.phase_end and step < steps:
            self.phase.update(curve_point(evaluate(model, self.tokenizer, self.final_problems, 8)), step=step)
        if step < steps:
            self.validation[step] = curve_point(evaluate(model, self.tokenizer, self.validation_problems, 8))
            self.snapshots[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.eval_seconds += time.perf_counter() - start

    def select(self, model, final: dict) -> dict:
        """The held-out scores at the step whose validation pass@1 is best (the last step's: `final`), with the step;
        the trained weights are replaced by the selected snapshot's."""
        from .evaluate import evaluate

        steps = self.job["steps"]
        self.validation[steps] = curve_point(evaluate(model, self.tokenizer, self.validation_problems, 8))
        best = max(self.validation, key=lambda step: (self.validation[step]["pass@1"], step))
        if best == steps:
            return {**curve_point(final), "step": best}
        model.load_state_dict(self.snapshots[best])
        return {**curve_point(evaluate(model, self.tokenizer, self.final_problems, 8)), "step": best}


def decaying_judge_share(phase_end: int):
    """A callback for the decaying-judge-share arm: the intervention budget controller's target
    (`judge_token_target`, set by the arm's config) falls linearly from its configured value at step 0 to 0 at the end
    of the intervention phase (the controller holds the share of judge tokens near the target)."""

    class DecayingJudgeShare(TrainerCallback):
        start: float | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = self.start or args.judge_token_target
            args.judge_token_target = max(self.start * (1 - state.global_step / phase_end), 1e-3)

    return DecayingJudgeShare()


def baseline(job: dict) -> dict:
    """The regime's calibration at the warm start on the held-out problems (`benchmarks.tasks.toy.calibration`: pass@1 /
    pass@8 / pass@64 from `calibration_samples` samples, 8 unless the job says, and the same problems in familiar
    notation where there is a new operator) and step 0 of every curve."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .calibration import calibrate, judge_calibration
    from .evaluate import evaluate

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
    regime = REGIMES[regime_name]
    if not regime.new_op:
        return [regime.judge_notation]
    return list(dict.fromkeys([regime.judge_notation, "near", "far"]))


def execute(
    results: dict, out: Path, json_name: str, render_fn, baseline_jobs, run_fn, jobs, workers: int, resume=False
) -> None:
    """The toy studies' runner: `harness.execute` of the baselines (`(function, job)` pairs) and `run_fn` on every
    job, with each arm's provenance (`records.note_arm`) kept and a line per finished run."""
    harness.execute(results, out, json_name, jobs, run_fn, workers=workers, baselines=baseline_jobs,
                    render=render_fn, describe=describe_run, on_record=note_arm, resume=resume)  # fmt: skip


def describe_run(run: dict) -> str:
    return (
        f"{run['name']}: pass@1 {100 * run['final']['pass@1']:.1f} pass@8 {100 * run['final']['pass@8']:.1f} "
        f"({run['train_seconds']:.0f}s train)"
    )


def rerun_recorded(results: dict, jobs: list[dict], workers: int) -> list[dict]:
    """Rerun `jobs`, runs recorded in `results`, at this checkout and compare their final pass@1 / pass@8 with the
    recorded ones: a row per run (its name, the commit that recorded it, both scores, whether they are the same),
    printed as it is compared."""
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
    return rows
