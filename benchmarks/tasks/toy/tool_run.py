"""One learning run on the tool task (`tool_task`), as a job the harness runs in a worker process: a (regime, label,
seed) job trained from the tool warm start with TRL's tool loop (`RegisterEnv`) and scored on the held-out problems
with the tool loop on (`run_job`); the SFT on reference transcripts the `sft-grpo` arm starts with."""

from __future__ import annotations

import time

from benchmarks.lib.harness import step_logs

from .arms import LOGGED
from .training import HELDOUT_SEED, TRAIN_SEED

TOOL_LOGGED = (*LOGGED, "tools/call_frequency", "tools/failure_frequency")


def held_out_scores(model, tokenizer, problems, seed: int = 0) -> dict:
    """pass@1 / pass@8 (8 samples at temperature 1, tool loop on, no judge) and the share of rollouts that read every
    register; reproducible for a seed, the torch RNG restored."""
    from .tool_calibration import pass_scores, tool_rollouts

    scores = pass_scores(problems, tool_rollouts(model, tokenizer, problems, 8, seed=seed), 8)
    return {k: scores[k] for k in ("pass@1", "pass@8", "read_all")}


def sft_on_transcripts(model, tokenizer, problems, *, batch_size: int, learning_rate: float, seed: int) -> int:
    """One epoch of SFT on `problems`' reference transcripts (calls, result tokens without loss, computation), in
    order, with the warm start's optimiser at a constant rate; returns the optimizer steps."""
    import random

    from .tool_chat import sft_example
    from .warm_start import pad_batch, sft_epoch

    rng = random.Random(seed)
    rows = [sft_example(tokenizer, p, True, rng) for p in problems]
    batches = (pad_batch(tokenizer, rows[start : start + batch_size]) for start in range(0, len(rows), batch_size))
    return sft_epoch(model, batches, learning_rate)


def train_dataset(problems):
    """The training rows: the task's columns and `reference`, the reference transcript (SORT's reference column)."""
    from datasets import Dataset

    return Dataset.from_list([{**p.row(), "reference": p.reference_messages()} for p in problems])


def run_job(job: dict) -> dict:
    """Train one (regime, label, seed) run in this process; return its curve, final scores, per-step logs and time."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    from .tool_judge import tool_judge
    from .tool_task import TOOL_FIELDS, RegisterEnv, make_tool_problems, tool_reward
    from .training import build_trainer, rl_config
    from .warm_start_tools_build import WARM_START_TOOLS_DIR

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(WARM_START_TOOLS_DIR)  # the tool chat and response templates
    model = AutoModelForCausalLM.from_pretrained(WARM_START_TOOLS_DIR)
    final_problems = make_tool_problems(job["final_prompts"], HELDOUT_SEED, job["regime"])
    curve_problems = final_problems[: job["curve_prompts"]]
    train_problems = make_tool_problems(
        job["steps"] * job["prompts_per_step"], TRAIN_SEED + job["seed"], job["regime"]
    )
    curve, eval_seconds = {}, 0.0

    class CurveCallback(TrainerCallback):
        """Held-out scores on the curve set every `eval_every` steps (not counted in training time)."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            nonlocal eval_seconds
            if state.global_step % job["eval_every"] == 0 and state.global_step < job["steps"]:
                start = time.perf_counter()
                curve[state.global_step] = held_out_scores(model, tokenizer, curve_problems)
                eval_seconds += time.perf_counter() - start

    sft, sft_seconds = job["overrides"].get("_sft_first"), 0.0
    curve[0] = held_out_scores(model, tokenizer, curve_problems)
    if sft is not None:
        start = time.perf_counter()
        sft_steps = sft_on_transcripts(model, tokenizer, train_problems, seed=job["seed"], **sft)
        sft_seconds = time.perf_counter() - start
        sft_end = {**held_out_scores(model, tokenizer, final_problems), "steps": sft_steps}
    overrides = {k: v for k, v in job["overrides"].items() if not k.startswith("_")}
    overrides["per_device_train_batch_size"] = job["prompts_per_step"] * 8 * job["overrides"].get("_batch_factor", 1)
    args = rl_config(job["method"], f"/tmp/trl_mintrl_bench/{job['name']}", steps=job["steps"], seed=job["seed"],
                     regime="in-band", **TOOL_FIELDS, **overrides)  # fmt: skip
    trainer = build_trainer(job["method"], model, tokenizer, train_dataset(train_problems), args, judge=tool_judge(),
                            callbacks=[CurveCallback()], reward=tool_reward, environment_factory=RegisterEnv)  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start - eval_seconds + sft_seconds
    final = held_out_scores(trainer.model, tokenizer, final_problems)
    curve[job["steps"]] = held_out_scores(trainer.model, tokenizer, curve_problems)
    logs = step_logs(trainer.state.log_history, TOOL_LOGGED)
    return {
        **job,
        "final": final,
        "curve": curve,
        "logs": logs,
        "train_seconds": train_seconds,
        **({"sft_end": sft_end} if sft is not None else {}),
    }
