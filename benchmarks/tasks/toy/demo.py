"""The toy demos (`examples/mintrl_toy.py`, `examples/sort_toy.py`): one method and plain GRPO from the same warm
start, with the same prompts, steps and optimiser, held-out accuracy before and after, then what the committed
learning benchmark found for the same arm over several seeds (one seed cannot resolve a difference).

A demo's defaults are one seed of a benchmark arm (benchmarks/studies/learning.py, full mode): it trains the same job as the
benchmark's seed 0 and prints the same numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import sys
import time
import warnings

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
from transformers.utils import logging as hf_logging

from benchmarks.tasks.toy import evaluate
from benchmarks.tasks.toy.demo_claim import committed_comparison, load_results
from benchmarks.tasks.toy.training import HELDOUT_SEED, REGIMES, TRAIN_SEED, build_trainer, rl_config

NAMES = {"mintrl-const": "MInTRL", "sort": "SORT", "grpo": "GRPO"}


class ProgressLine(TrainerCallback):
    """One line per training run: rewritten in place after every step on a terminal; elsewhere (a CI log, a pipe)
    printed once, when the run ends."""

    def __init__(self, name: str, stream=None):
        self.name, self.stream = name, stream or sys.stdout
        self.live = self.stream.isatty()
        self.rewards, self.judge_shares, self.repairs, self.width = [], [], 0, 0
        self.start = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()
        if self.live:
            self._write(self.line(state), end="\r")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:
            return
        self.rewards.append(logs["reward"])
        if logs.get("mintrl/interventions_active"):
            self.judge_shares.append(logs["mintrl/judge_token_frac"])
        self.repairs += "sort/repair_loss" in logs
        if self.live:
            self._write(self.line(state), end="\r")

    def on_train_end(self, args, state, control, **kwargs):
        self._write(self.line(state), end="\n")

    def line(self, state) -> str:
        minutes = (time.perf_counter() - self.start) / 60
        text = f"{self.name:<6} step {state.global_step:>3}/{state.max_steps}  {minutes:.1f} min"
        if self.rewards:
            text += f"  train reward {self.rewards[-1]:.3f} (mean {sum(self.rewards) / len(self.rewards):.3f})"
        if self.judge_shares:
            share = sum(self.judge_shares) / len(self.judge_shares)
            text += f"  judge {100 * share:.1f}% of tokens ({len(self.judge_shares)} steps)"
        if self.repairs:
            text += f"  repairs at {self.repairs} steps"
        return text

    def _write(self, text: str, end: str) -> None:
        if self.live:  # a line wider than the terminal would wrap, and "\r" would not rewrite it
            text = text[: shutil.get_terminal_size().columns - 1]
            text, self.width = "\r" + text.ljust(self.width), len(text)  # cover a longer previous line
        self.stream.write(text + end)
        self.stream.flush()


class _DropMessage(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


@contextlib.contextmanager
def quiet_libraries():
    """What the libraries print that a demo user can do nothing about: transformers' weight-loading bar on every
    `from_pretrained`, TRL's call of transformers' deprecated `is_gradient_checkpointing` at every generation, and
    DeepSpeed's note (when it is installed) that it found no GPU; this demo trains on CPU."""
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    deepspeed_note = _DropMessage("Setting accelerator to CPU")
    logging.getLogger("DeepSpeed").addFilter(deepspeed_note)  # DeepSpeed sets up this logger when first imported
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            yield
    finally:
        logging.getLogger("DeepSpeed").removeFilter(deepspeed_note)
        if bars:
            hf_logging.enable_progress_bar()


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
    judge = (
        settings.judge(args.seed) if method == "mintrl-const" else None
    )  # the regime's rule judge, as the benchmark
    planner = settings.planner() if method == "sort" and settings.planner is not None else None
    trainer = build_trainer(
        method, model, tokenizer, train, config, judge=judge, callbacks=[ProgressLine(NAMES[method])],
        reward=settings.reward, planner=planner,
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)
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
    with quiet_libraries():
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
