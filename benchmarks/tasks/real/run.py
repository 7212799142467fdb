"""One run of the real-model comparison, SmolLM2-135M-Instruct on the word problems from the format warm start
(`warm_start`), as a job the harness runs in a process of its own: the jobs of a plan (`plan_jobs`), the warm start's
own scores once per regime (`measure_warm_start`) and one (regime, arm, seed) run (`run_job`): the arm's trainer
(`arms`), trained with a clock (each optimizer step's seconds; the curve set's scores every `eval_every` steps) and a
checkpoint every step, from which a run that its sitting's end interrupted resumes (`train`), then measured
(`measures`): held-out pass@1 and pass@8 on `heldout` and `heldout_longer`, the chat answers' NLL at the start and the
end, the mean per-token KL to the warm start on the policy's own samples of the curve set, and the trainer's per-step
log (`LOGGED`). `FULL` and `SMOKE` are the sizes of a full run and of the one-step smoke test."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.lib.harness import step_logs

from .warm_start import WARMUP, WARMUP_CHAIN_LONG

MODEL_ENV = "TRL_MINTRL_SMOLLM2_DIR"  # the prepared model's folder, for worker processes (tests/conftest.py's too)
CHECKPOINTS_ENV = "TRL_MINTRL_BENCH_RUNS"  # where runs keep their last checkpoint (`run_folder`)
CLOCK_FILE = "bench_clock.json"  # the clock's records in a checkpoint, written after the trainer's files
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
# the chain family at 12 steps (`warm_start.CHAIN_REGIMES`), from its chained warm start, as the fourth chain
# calibration met its criteria: 320-token completions (12-step rollouts are about 210 tokens), MInTRL's chunks of 64;
# micro-batches of 4 rows: a pass with gradients over 8 rows of ~470 tokens adds ~8 GB (arms.py), and two runs side by
# side at 8 rows ran out of the machine's 24 GB
CHAIN = dict(warmup=WARMUP_CHAIN_LONG, max_completion_length=320, overrides={"chunk_size": 64}, micro_batch=4)
SMOKE = {**FULL, "steps": 1, "seeds": [0], "prompts_per_step": 1, "max_completion_length": 16, "final_problems": 1,
         "curve_problems": 1, "curve_points": 1, "warmup": SMOKE_WARMUP,
         "overrides": {"chunk_size": 8, "judge_max_review_tokens": 32, "max_plan_tokens": 16}}  # fmt: skip


def measure_keys(settings: dict) -> dict:
    """The fields of a job that decide what is measured and from which warm start (its settings: the base model is
    the pinned GGUF, so a job's key is the same on every machine)."""
    keys = ("prompts_per_step", "max_completion_length", "final_problems", "curve_problems", "engine", "warmup")
    return {k: settings[k] for k in keys}


def plan_jobs(settings: dict, arms: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    """(baseline jobs, run jobs): the warm start measured once per regime, then one run per (regime, seed, arm) in
    plan order (`arms`: only these); an arm's `overrides` are the settings' and its own of `arm_overrides`, if any."""
    common = measure_keys(settings)
    baselines, runs = [], []
    for regime, labels in settings["plan"].items():
        baselines.append({**common, "name": f"real-{regime}-warm-start", "regime": regime, "arm": "warm-start"})
        for seed in settings["seeds"]:
            for arm in labels:
                if arms and arm not in arms:
                    continue
                runs.append({**common, "name": f"real-{regime}-{arm}-s{seed}", "regime": regime, "arm": arm,
                             "seed": seed, "steps": settings["steps"],
                             "overrides": {**settings["overrides"], **settings.get("arm_overrides", {}).get(arm, {})},
                             "eval_every": max(1, settings["steps"] // settings["curve_points"]),
                             **({"micro_batch": settings["micro_batch"]} if "micro_batch" in settings else {})})  # fmt: skip
    return baselines, runs


def model_dir() -> Path:
    from .warm_start import DEFAULT_MODEL

    return Path(os.environ.get(MODEL_ENV, DEFAULT_MODEL))


def load_warm_start(job: dict):
    """(tokenizer, model, warm start folder) of the job's warm start, built first when missing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_mintrl.smollm2 import prepare_smollm2

    from .warm_start import build_warm_start

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    folder = build_warm_start(prepare_smollm2(model_dir()), job["warmup"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), folder


def held_out(job: dict) -> dict:
    from .warm_start import regime_splits

    splits = regime_splits(job["regime"])
    return {name: splits[name][: job["final_problems"]] for name in ("heldout", "heldout_longer")}


def final_scores(model, tokenizer, job: dict, seed: int, engine=None, folder: Path | None = None) -> tuple[dict, dict]:
    """Held-out pass@k on both sets (and the curve set inside `heldout`); the `heldout` samples drawn (by `engine`
    when given: `sampling_engine`). With `folder` (a run's), each set's samples are kept there once drawn, and a
    measure that its sitting's end cut short draws only the sets it had not (the weights are the last checkpoint's
    either way)."""
    from .measures import held_out_samples, pass_scores

    scores, drawn = {}, {}
    for name, problems in held_out(job).items():
        kept = folder / f"held-out-{name}.json" if folder is not None else None
        if kept is not None and kept.is_file():
            drawn[name] = json.loads(kept.read_text())
        else:
            drawn[name] = held_out_samples(model, tokenizer, problems, job["max_completion_length"], seed=seed,
                                           engine=engine)  # fmt: skip
            if kept is not None:
                kept.write_text(json.dumps(drawn[name]))
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
    from .measures import chat_kept
    from .warm_start import warm_start_record

    tokenizer, model, folder = load_warm_start(job)
    began = time.perf_counter()
    engine = warm_start_engine(job, folder)
    try:
        scores, _ = final_scores(model, tokenizer, job, seed=0, engine=engine)
    finally:
        if engine is not None:
            engine.close()
    chat = chat_kept(model, tokenizer)
    return {**job, "scores": scores, "chat": chat, "built": warm_start_record(folder),
            "sampled_by": "vllm" if engine is not None else "transformers",
            "measure_seconds": time.perf_counter() - began}  # fmt: skip


def warm_start_engine(job: dict, folder: Path):
    """For a plan whose runs roll out with vLLM, a standalone vllm-cpu engine on the warm start to draw its held-out
    samples with (the runs' held-out samples come from their trainer's engine: `sampling_engine`), at the same
    settings: temperature 1, top-p 1, no top-k; None otherwise (`transformers`, as the warm start measures of the
    records without `sampled_by` were drawn)."""
    if job["engine"] != "vllm":
        return None
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from trl_mintrl.engines.vllm import VLLMEngine

    from .arms import VLLM_CPU_LLM_KWARGS

    return VLLMEngine.from_model_path(str(folder), **VLLM_CPU_LLM_KWARGS, temperature=1.0)


def run_job(job: dict) -> dict:
    """Train one (regime, arm, seed) run in this process from the warm start; return its measures (module
    docstring)."""
    from .measures import chat_kept, kl_to
    from .warm_start import train_problems

    tokenizer, model, folder = load_warm_start(job)
    chat_start = chat_kept(model, tokenizer)
    problems = train_problems(job["regime"], job["steps"] * job["prompts_per_step"], job["seed"])
    trainer, clock, sft = train(job, model, tokenizer, problems)
    policy = trainer.model.eval()
    scores, drawn = final_scores(policy, tokenizer, job, seed=job["seed"], engine=clock.engine, folder=run_folder(job))
    clock.curve[job["steps"]] = scores["curve"]
    chat_end = chat_kept(policy, tokenizer)
    kl = kl_to(policy, load_warm_start(job)[1].eval(), drawn, job["curve_problems"])
    shutil.rmtree(run_folder(job), ignore_errors=True)  # measured: its checkpoint is no longer needed
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
        "resumed_at": clock.resumed_at,
        **({"sft": sft} if sft else {}),
    }


def sft_phase(model, tokenizer, problems, job: dict, engine=None) -> dict:
    """`sft_first`'s record, kept in the run's folder: a resumed run reads it (its checkpoint holds the weights after
    SFT) instead of training the SFT epoch again."""
    saved = run_folder(job) / "sft.json"
    if last_checkpoint(run_folder(job)) is not None and saved.is_file():
        return json.loads(saved.read_text())
    sft = sft_first(model, tokenizer, problems, job, engine)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(sft))
    return sft


def sft_first(model, tokenizer, problems, job: dict, engine=None) -> dict:
    """sft-grpo's first phase: one SFT epoch on the training problems' references (the warm-up's settings); its
    seconds, losses and the curve set's scores after it (drawn by `engine` when given: the GRPO trainer's, which
    syncs the weights SFT wrote)."""
    from .measures import held_out_samples, pass_scores
    from .warm_start import sft_epoch

    began = time.perf_counter()
    losses = sft_epoch(model, tokenizer, problems, batch_size=job["warmup"]["batch_size"],
                       learning_rate=job["warmup"]["learning_rate"])  # fmt: skip
    seconds = time.perf_counter() - began
    curve_set = held_out(job)["heldout"][: job["curve_problems"]]
    drawn = held_out_samples(model, tokenizer, curve_set, job["max_completion_length"], seed=job["seed"],
                             engine=engine)  # fmt: skip
    return {"seconds": seconds, "steps": len(losses), "losses": losses, "curve": pass_scores(curve_set, drawn)}


def run_folder(job: dict) -> Path:
    """Where a run keeps its last checkpoint until its record is written: one folder per job (its name and
    `harness.job_key`), under `CHECKPOINTS_ENV` or ~/.cache/trl-mintrl/bench-runs, outside the repository and /tmp so
    that the next sitting on this machine finds it."""
    from benchmarks.lib.harness import job_key

    root = Path(os.environ.get(CHECKPOINTS_ENV, "~/.cache/trl-mintrl/bench-runs")).expanduser()
    return root / f"{job['name']}-{job_key(job)}"


def last_checkpoint(folder: Path) -> Path | None:
    """The run's last complete checkpoint: the newest checkpoint-N with the clock's file, which is written after
    the trainer's (a sitting ended during a save leaves none)."""
    done = [c for c in folder.glob("checkpoint-*") if (c / CLOCK_FILE).is_file()]
    return max(done, key=lambda c: int(c.name.split("-")[1]), default=None)


def train(job: dict, model, tokenizer, problems):
    """Build the arm's trainer with a `Clock` (per-step seconds, the curve) and train it, saving a checkpoint every
    step: a run its sitting's end interrupted resumes from its last one (the trainer's weights, optimizer, schedule
    and RNG, the clock's records; its later rollouts draw from vLLM's fresh random state). sft-grpo's SFT epoch
    (`sft_phase`) runs between building the trainer and training it, so that its curve point is drawn by the
    trainer's vLLM engine (about 4x faster than `transformers`); (trainer, clock, the SFT record or None)."""
    from datasets import Dataset
    from transformers import PrinterCallback

    from .arms import build_trainer

    folder = run_folder(job)
    checkpoint = last_checkpoint(folder)
    clock = make_clock(job, tokenizer, json.loads((checkpoint / CLOCK_FILE).read_text()) if checkpoint else None)
    dataset = Dataset.from_list([p.row() for p in problems])
    trainer = build_trainer(job["arm"], job, model, tokenizer, dataset, str(folder), callbacks=[clock], save_every=1)
    trainer.remove_callback(PrinterCallback)
    clock.engine = sampling_engine(trainer)
    sft = sft_phase(model, tokenizer, problems, job, clock.engine) if job["arm"] == "sft-grpo" else None
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    return trainer, clock, sft


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


def make_clock(job: dict, tokenizer, resumed: dict | None = None):
    """A callback that records each optimizer step's wall-clock seconds and, every `eval_every` steps before the
    last, the curve set's scores (neither the curve nor a checkpoint's save counted in a step's seconds); it writes
    what it recorded into each checkpoint (`CLOCK_FILE`), and `resumed` (that file's content) continues it, the step
    resumed from added to `resumed_at`."""
    from transformers import TrainerCallback

    from benchmarks.lib.provenance import MachineWatch

    from .measures import held_out_samples, pass_scores

    curve_set = held_out(job)["heldout"][: job["curve_problems"]]

    class Clock(TrainerCallback):
        def __init__(self):
            resumed_from = resumed or {}
            self.seconds = list(resumed_from.get("seconds", []))
            self.curve = {int(step): scores for step, scores in resumed_from.get("curve", {}).items()}
            self.eval_seconds = resumed_from.get("eval_seconds", 0.0)
            self.resumed_at = [*resumed_from.get("resumed_at", []), *([len(self.seconds)] if resumed else [])]
            self.watch = MachineWatch(resumed=resumed_from.get("watch"))
            self.last = None
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

        def on_save(self, args, state, control, **kwargs):
            record = {"seconds": self.seconds, "curve": self.curve, "eval_seconds": self.eval_seconds,
                      "resumed_at": self.resumed_at, "watch": self.watch.state()}  # fmt: skip
            (Path(args.output_dir) / f"checkpoint-{state.global_step}" / CLOCK_FILE).write_text(json.dumps(record))
            self.last = time.perf_counter()

    return Clock()


def describe(record: dict) -> str:
    f = record["final"]
    return (f"{record['name']}: pass@1 {100 * f['pass@1']:.1f}%, pass@8 {100 * f['pass@8']:.1f}%, longer pass@1 "
            f"{100 * f['longer_pass@1']:.1f}%, chat NLL {f['chat_nll_change']:+.3f}, KL {f['kl']:.3f}, "
            f"{statistics.fmean(record['step_seconds']):.0f} s/step")  # fmt: skip
