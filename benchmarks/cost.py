"""What MInTRL and SORT cost per optimizer step, relative to a plain GRPO step on the same model and settings.

    python benchmarks/cost.py            # 12 measured steps per variant (~18 min with other jobs on the machine)
    python benchmarks/cost.py --quick    # 4 measured steps per variant

Time: all variants train in one process and take turns, one optimizer step each per round, so machine noise
(other jobs, thermal state) hits every variant alike; the table reports the median step over the measured rounds
as a ratio to GRPO's. Every variant draws the same prompts (16 x 8 rollouts per step) from the warm start with
learning rate 0 and the same random seed per round, so GRPO, MInTRL after its intervention phase and SORT without a
repair sample identical rollouts and their ratio is the method's own overhead. Memory: each variant then runs alone
in a fresh process; after two warm-up steps (lazy imports, first allocations) the peak RSS over three steps, and that
peak above the RSS just before them (the step's working memory: activations, KV caches, judge prompts).

Variants: GRPO; MInTRL with rule-judge interventions; MInTRL after the intervention phase (all rollouts on-policy
controls); MInTRL with the self-judge (the policy reviews and corrects itself with the reference as privileged
context); SORT with a repair every step (buffer pre-filled); SORT without repairs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

RESULTS = Path(__file__).parent / "results"

# name -> (method, config overrides)
VARIANTS = {
    "grpo": ("grpo", {}),
    "mintrl_interventions": ("mintrl-const", {"intervention_steps": 10**6}),
    "mintrl_after_phase": ("mintrl-const", {"intervention_steps": 0}),
    "mintrl_self_judge": ("mintrl-const", {"intervention_steps": 10**6, "judge": "self"}),
    "sort_repair": ("sort", {}),
    "sort_no_repair": ("sort", {"repair_batch_size": 10**6}),
}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class CallCounter:
    """Counts calls of a method on one object (generation calls of the model, judge review/correct calls)."""

    def __init__(self, obj, name: str):
        self.calls = 0
        original = getattr(obj, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        setattr(obj, name, counted)


def build(variant: str, steps: int, rounds_of_repairs: int):
    """A trainer of `variant` on the warm start with learning rate 0, plus its call counters."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from trl_mintrl.toy import WARM_START_DIR, make_dataset, make_problems
    from trl_mintrl.toy.training import RL_MAX_OPS, RL_MIN_OPS, build_trainer, rl_config

    torch.set_num_threads(1)
    method, overrides = VARIANTS[variant]
    tokenizer = AutoTokenizer.from_pretrained(WARM_START_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_DIR)
    generate = CallCounter(model, "generate")
    train = make_dataset(16 * steps, RL_MIN_OPS, RL_MAX_OPS, seed=7)
    args = rl_config(method, f"/tmp/trl_mintrl_cost/{variant}", steps=steps, learning_rate=0.0, **overrides)
    judge = None if overrides.get("judge") == "self" else "rule"
    trainer = build_trainer(method, model, tokenizer, train, args, judge=judge)
    trainer.remove_callback(PrinterCallback)
    counters = {"generate": generate}
    if method == "sort" and variant == "sort_repair":
        for problem in make_problems(8 * rounds_of_repairs, RL_MIN_OPS, RL_MAX_OPS, seed=8):
            row = problem.row()
            trainer.sort_buffer.add(row["prompt"], row["solution"])
    judge = getattr(trainer, "judge", None)
    if judge is not None:
        counters["review"] = CallCounter(judge, "review")
        counters["correct"] = CallCounter(judge, "correct")
    return trainer, counters


class Turns:
    """Round-robin turn-taking between trainer threads at optimizer-step boundaries."""

    def __init__(self, names: list[str]):
        self.order = names
        self.turn = 0
        self.done: set[str] = set()
        self.cond = threading.Condition()

    def wait(self, name: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.order[self.turn] == name)

    def pass_on(self, name: str, finished: bool = False) -> None:
        """Hand the turn to the next unfinished thread (only the holder hands it on; a failed thread just leaves)."""
        with self.cond:
            if finished:
                self.done.add(name)
            if self.order[self.turn] == name and len(self.done) < len(self.order):
                self.turn = (self.turn + 1) % len(self.order)
                while self.order[self.turn] in self.done:
                    self.turn = (self.turn + 1) % len(self.order)
            self.cond.notify_all()


def measure_time(variants: list[str], warmup: int, rounds: int) -> dict:
    """Interleaved training: per variant, per measured step: seconds, generation/judge calls, judge tokens."""
    import torch
    from transformers import TrainerCallback

    steps = warmup + rounds
    trainers = {v: build(v, steps, steps) for v in variants}
    turns = Turns(variants)
    records = {v: [] for v in variants}

    class StepTimer(TrainerCallback):
        def __init__(self, name: str):
            self.name, self.holding, self.start, self.calls = name, False, 0.0, {}

        def on_step_begin(self, args, state, control, **kwargs):
            if self.holding:
                turns.pass_on(self.name)
            turns.wait(self.name)
            self.holding = True
            torch.manual_seed(10_000 + state.global_step)  # same sampling noise for every variant of a round
            self.calls = {k: c.calls for k, c in trainers[self.name][1].items()}
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.start
            trainer, counters = trainers[self.name]
            record = {"seconds": seconds, **{k: c.calls - self.calls[k] for k, c in counters.items()}}
            stats = getattr(trainer, "_rollout_stats", None)
            if stats is not None:
                record["judge_tokens"] = stats[:, 3].sum().item()
                record["completion_tokens"] = stats[:, 4].sum().item()
            records[self.name].append(record)

        def on_train_end(self, args, state, control, **kwargs):
            turns.pass_on(self.name, finished=True)

    errors = []

    def train(name: str):
        trainer = trainers[name][0]
        trainer.add_callback(StepTimer(name))
        try:
            trainer.train()
        except BaseException as err:  # surface in the main thread; let the others finish
            errors.append((name, err))
            turns.pass_on(name, finished=True)

    threads = [threading.Thread(target=train, args=(v,)) for v in variants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{errors[0][0]} failed") from errors[0][1]
    repairs = {
        v: trainers[v][0].sort_buffer.counters["repairs"] for v in variants if hasattr(trainers[v][0], "sort_buffer")
    }
    return {"steps": {v: r[warmup:] for v, r in records.items()}, "repairs": repairs}


def measure_memory(variant: str, warmup: int, steps: int) -> dict:
    """Run `variant` alone in this (fresh) process; over the `steps` steps after `warmup` (lazy imports and first-step
    allocations done): peak RSS, and that peak above the RSS just before them, in MB."""
    from transformers import TrainerCallback

    trainer, _ = build(variant, warmup + steps, warmup + steps)
    before = {}

    class ResetPeak(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # reset the peak-RSS counter (Linux)
                before["kb"] = _status_kb("VmRSS")

    trainer.add_callback(ResetPeak())
    trainer.train()
    peak = _status_kb("VmHWM")
    return {"variant": variant, "transient_mb": (peak - before["kb"]) / 1024, "peak_mb": peak / 1024}


def table(time_result: dict, memory: dict[str, dict]) -> str:
    steps = time_result["steps"]
    base = statistics.median(r["seconds"] for r in steps["grpo"])
    base_mem = memory.get("grpo")
    lines = [
        "| variant | median step s | x GRPO time | generation calls / step | judge review / correct calls / step "
        "| judge tokens / step (share) | step peak above pre-step RSS, MB (x GRPO) | peak RSS MB (x GRPO) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, records in steps.items():
        seconds = statistics.median(r["seconds"] for r in records)
        gen = statistics.mean(r["generate"] for r in records)
        judge = "-"
        if "review" in records[0]:
            judge = (
                f"{statistics.mean(r['review'] for r in records):.1f} / "
                f"{statistics.mean(r['correct'] for r in records):.1f}"
            )
        tokens = "-"
        if "judge_tokens" in records[0]:
            jt = statistics.mean(r["judge_tokens"] for r in records)
            share = sum(r["judge_tokens"] for r in records) / max(sum(r["completion_tokens"] for r in records), 1)
            tokens = f"{jt:.0f} ({100 * share:.1f}%)"
        mem = memory.get(name)
        mem_cells = "- | -"
        if mem and base_mem:
            mem_cells = (
                f"{mem['transient_mb']:.0f} ({mem['transient_mb'] / max(base_mem['transient_mb'], 1e-9):.2f}) | "
                f"{mem['peak_mb']:.0f} ({mem['peak_mb'] / base_mem['peak_mb']:.2f})"
            )
        lines.append(
            f"| {name} | {seconds:.2f} | {seconds / base:.2f} | {gen:.1f} | {judge} | {tokens} | {mem_cells} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured first steps per variant")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if "grpo" not in args.variants:
        args.variants.insert(0, "grpo")
    rounds = args.rounds or (4 if args.quick else 12)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    time_result = measure_time(args.variants, args.warmup, rounds)
    memory = {}
    context = get_context("spawn")
    for variant in args.variants:  # one at a time: a fresh process each, nothing else running in it
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            memory[variant] = pool.submit(measure_memory, variant, args.warmup, 3).result()
    text = table(time_result, memory)
    text += (
        f"\n\n{rounds} measured steps per variant after {args.warmup} warm-up steps, interleaved; 128 rollouts per "
        f"step; SORT repairs done: {time_result['repairs']}. Total {(time.perf_counter() - start) / 60:.1f} min."
    )
    (out / "cost.md").write_text(text + "\n")
    (out / "cost.json").write_text(json.dumps({"time": time_result, "memory": memory}, indent=1))
    print(text)


if __name__ == "__main__":
    sys.exit(main())
