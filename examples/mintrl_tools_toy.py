"""MInTRL in a tool-calling rollout on CPU: a ~1M-parameter model learns to read registers with a tool it rarely
calls, from a judge whose correction is the tool call.

    python examples/mintrl_tools_toy.py [--regime in-band|reachable] [--seed 0] [--no-grpo]

The task (benchmarks/tasks/toy/tool_task.py): `Compute 4+a-b+2 =`, where the registers' values live only in the environment
(`RegisterEnv`, passed as TRL's `environment_factory=`; its `get(name)` method is the tool, `[get name=a]` in the
policy's format). The reward is 1 for the right answer with every register read through the tool: a guess earns
nothing. The committed warm start (benchmarks/tasks/toy/warm_start_tools/) guesses instead of calling on `Compute`
problems (the in-band regime: held-out pass@64 0%), while the call is not foreign to it (it calls on `Evaluate`
problems, the reachable regime: pass@8 28%). MInTRL samples 4 control and 4 intervened rollouts per prompt; on the
intervened ones a rule judge reads the conversation so far, flags the first wrong or missing call, writes the next call
`[get name=a]`, and the environment executes it; the policy continues. The same demo then runs TRL's `GRPOTrainer`
with the same environment, prompts, steps and optimiser.

The defaults are one seed of the tool benchmark's arms (benchmarks/studies/learning_tools.py, 48 steps x 8 prompts, 96
held-out problems, pass@k with the tool loop on): the demo trains the same jobs and prints the same numbers. One seed
cannot resolve a difference, so it ends with what the committed benchmark (benchmarks/results/learning_tools.json,
5 seeds) found, read from the JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks.tasks.toy
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks.lib.records import RESULTS  # noqa: E402
from benchmarks.studies.learning_tools import MODES, plan_jobs  # noqa: E402
from benchmarks.tasks.toy.demo import quiet_libraries  # noqa: E402
from benchmarks.tasks.toy.demo_claim import committed_comparison, load_results  # noqa: E402
from benchmarks.tasks.toy.tool_run import held_out_scores, run_job  # noqa: E402
from benchmarks.tasks.toy.training import HELDOUT_SEED  # noqa: E402

NAMES = {"mintrl-const": "MInTRL", "grpo": "GRPO"}
LEARNING_TOOLS_JSON = RESULTS / "learning_tools.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    full = MODES["full"]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regime", default="in-band", choices=["in-band", "reachable"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=full["steps"])
    parser.add_argument("--prompts-per-step", type=int, default=full["prompts_per_step"])
    parser.add_argument("--eval-problems", type=int, default=full["final_prompts"])
    parser.add_argument("--no-grpo", dest="grpo", action="store_false", help="skip the GRPO comparison run")
    return parser.parse_args(argv)


def demo_job(label: str, args: argparse.Namespace) -> dict:
    """The benchmark's job for `label` on the demo's regime and seed, with the demo's steps and sizes."""
    settings = {**MODES["full"], "seeds": [args.seed], "plan": {args.regime: [label]}, "steps": args.steps,
                "prompts_per_step": args.prompts_per_step, "final_prompts": args.eval_problems,
                "curve_prompts": min(MODES["full"]["curve_prompts"], args.eval_problems)}  # fmt: skip
    [job] = plan_jobs(settings)
    return job


def warm_start_scores(args: argparse.Namespace) -> dict:
    """The warm start's held-out scores, as the benchmark scores a trained model (`held_out_scores`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy.tool_task import make_tool_problems
    from benchmarks.tasks.toy.warm_start_tools_build import WARM_START_TOOLS_DIR

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_TOOLS_DIR)
    tokenizer = AutoTokenizer.from_pretrained(WARM_START_TOOLS_DIR)
    return held_out_scores(model, tokenizer, make_tool_problems(args.eval_problems, HELDOUT_SEED, args.regime))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    labels = ["mintrl-const", "grpo"] if args.grpo else ["mintrl-const"]
    with quiet_libraries():
        warm = warm_start_scores(args)
        runs = {}
        for label in labels:
            print(
                f"training {NAMES[label]} ({args.steps} steps, {args.regime} regime, seed {args.seed}) ...", flush=True
            )
            runs[label] = run_job(demo_job(label, args))
    print(f"\n{args.eval_problems} held-out problems ({args.regime} regime), 8 samples each, tool loop on:")
    print(f"warm start    pass@1 {warm['pass@1']:.3f}  pass@8 {warm['pass@8']:.3f}  read every register in "
          f"{100 * warm['read_all']:.1f}% of rollouts")  # fmt: skip
    for label, run in runs.items():
        final = run["final"]
        print(f"after {NAMES[label]:<7} pass@1 {final['pass@1']:.3f}  pass@8 {final['pass@8']:.3f}  read every register "
              f"in {100 * final['read_all']:.1f}% of rollouts  ({run['train_seconds'] / 60:.1f} min)")  # fmt: skip
    active = [e for e in runs["mintrl-const"]["logs"] if e.get("mintrl/interventions_active")]
    if active:
        share = sum(e["mintrl/judge_token_frac"] for e in active) / len(active)
        print(f"MInTRL's judge wrote {100 * share:.1f}% of the policy's and judge's tokens during its first "
              f"{len(active)} steps (tool results excluded).")  # fmt: skip
    if args.grpo:
        ours, grpo = runs["mintrl-const"]["final"], runs["grpo"]["final"]
        print(f"This run, seed {args.seed}: MInTRL - GRPO pass@1 {100 * (ours['pass@1'] - grpo['pass@1']):+.1f}, "
              f"pass@8 {100 * (ours['pass@8'] - grpo['pass@8']):+.1f} points. One seed cannot resolve a difference "
              "between the methods; over several seeds:")  # fmt: skip
    demo = dict(steps=args.steps, prompts_per_step=args.prompts_per_step, final_prompts=args.eval_problems,
                seed=args.seed)  # fmt: skip
    print(committed_comparison(load_results(LEARNING_TOOLS_JSON), demo, regime=args.regime,
                               source="benchmarks/results/learning_tools.json"))  # fmt: skip


if __name__ == "__main__":
    main()
