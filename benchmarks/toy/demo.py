"""The toy demos (`examples/mintrl_toy.py`, `examples/sort_toy.py`): one method and plain GRPO from the same warm
start, with the same prompts, steps and optimiser, held-out accuracy before and after, then what the committed
learning benchmark found for the same arm over several seeds (one seed cannot resolve a difference).

A demo's defaults are one seed of a benchmark arm (benchmarks/learning.py, full mode): it trains the same job as the
benchmark's seed 0 and prints the same numbers.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

from benchmarks.demo_claim import committed_comparison, load_results
from benchmarks.learning import HELDOUT_SEED, TRAIN_SEED
from benchmarks.toy import evaluate, rule_judge
from benchmarks.toy.training import REGIMES, build_trainer, rl_config

NAMES = {"mintrl-const": "MInTRL", "sort": "SORT", "grpo": "GRPO"}


class StepLine(TrainerCallback):
    """One short line per optimizer step instead of the full log dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:
            return
        extra = ""
        if logs.get("mintrl/interventions_active"):
            extra = f"  judge tokens {100 * logs['mintrl/judge_token_frac']:.1f}%"
        elif "sort/repair_loss" in logs:
            extra = f"  repair from references (mean weight {logs['sort/mean_weight']:.2f})"
        print(f"step {state.global_step:>3}  train reward {logs['reward']:.3f}{extra}", flush=True)


def train_and_evaluate(method: str, regime: str, args, heldout) -> dict:
    """`method` ("mintrl-const", "sort" or "grpo") from `regime`'s warm start with the toy RL settings, its rule
    judge (MInTRL) or its planner (SORT) as the benchmark's job has them; held-out scores after."""
    settings = REGIMES[regime]
    tokenizer = AutoTokenizer.from_pretrained(settings.warm_start)
    model = AutoModelForCausalLM.from_pretrained(settings.warm_start)
    config = rl_config(
        method,
        f"{args.output_dir}/{method}",
        steps=args.steps,
        seed=args.seed,
        regime=regime,
        per_device_train_batch_size=8 * args.prompts_per_step,  # 8 rollouts per prompt
    )
    train = settings.dataset(args.steps * args.prompts_per_step, seed=TRAIN_SEED + args.seed)
    judge = rule_judge(seed=args.seed) if method == "mintrl-const" else None
    planner = settings.planner() if method == "sort" and settings.planner is not None else None
    trainer = build_trainer(
        method, model, tokenizer, train, config, judge=judge, callbacks=[StepLine()], reward=settings.reward,
        planner=planner,
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    print(f"--- {NAMES[method]}", flush=True)
    start = time.perf_counter()
    trainer.train()
    scores = evaluate(trainer.model, tokenizer, heldout, n_samples=8)
    scores["minutes"] = (time.perf_counter() - start) / 60
    active = [e for e in trainer.state.log_history if e.get("mintrl/interventions_active")]
    scores["judge_share"] = sum(e["mintrl/judge_token_frac"] for e in active) / max(len(active), 1)
    scores["intervention_steps"] = getattr(config, "intervention_steps", 0)
    scores["repair_steps"] = sum("sort/repair_loss" in e for e in trainer.state.log_history)
    return scores


def parse_args(description: str, output_dir: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--eval-problems", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-grpo", dest="grpo", action="store_false", help="skip the GRPO comparison run")
    parser.add_argument("--output-dir", default=output_dir)
    return parser.parse_args(argv)


def demo_arm(args: argparse.Namespace) -> dict:
    """The settings `committed_comparison` matches against the benchmark's runs."""
    return dict(
        steps=args.steps, prompts_per_step=args.prompts_per_step, final_prompts=args.eval_problems, seed=args.seed
    )


def run_demo(method: str, regime: str, args: argparse.Namespace) -> None:
    """Train and score `method` (and GRPO unless `args.grpo` is off) on `regime`; print the scores, what the
    method did, this seed's difference and the committed benchmark's line for the arm."""
    torch.set_num_threads(1)
    settings = REGIMES[regime]
    heldout = settings.problems(args.eval_problems, seed=HELDOUT_SEED)
    tokenizer = AutoTokenizer.from_pretrained(settings.warm_start)
    before = evaluate(AutoModelForCausalLM.from_pretrained(settings.warm_start), tokenizer, heldout, n_samples=8)
    results = {method: train_and_evaluate(method, regime, args, heldout)}
    if args.grpo:
        results["grpo"] = train_and_evaluate("grpo", regime, args, heldout)

    print(f"\n{len(heldout)} held-out problems ({regime} regime, {settings.min_ops}-{settings.max_ops} operations), "
          "8 samples each:")  # fmt: skip
    print(f"warm start         pass@1 {before['pass@1']:.3f}  pass@8 {before['pass@8']:.3f}")
    for name, scores in results.items():
        print(
            f"after {NAMES[name]:<12} pass@1 {scores['pass@1']:.3f}  pass@8 {scores['pass@8']:.3f}  "
            f"({args.steps} steps, {scores['minutes']:.1f} min)"
        )
    ours, name = results[method], NAMES[method]
    if method == "mintrl-const":
        print(f"{name}'s judge wrote {100 * ours['judge_share']:.1f}% of completion tokens during its first "
              f"{ours['intervention_steps']} steps.")  # fmt: skip
    else:
        print(f"{name} trained on reference solutions (a full buffer of all-wrong prompts) at {ours['repair_steps']} "
              f"of its {args.steps} steps.")  # fmt: skip
    if args.grpo:
        grpo = results["grpo"]
        print(
            f"This run, seed {args.seed}: {name} - GRPO pass@1 {100 * (ours['pass@1'] - grpo['pass@1']):+.1f}, "
            f"pass@8 {100 * (ours['pass@8'] - grpo['pass@8']):+.1f} points. One seed cannot resolve a difference "
            "between the methods; over several seeds:"
        )
    print(committed_comparison(load_results(), demo_arm(args), regime=regime, label=method, baseline="grpo"))
