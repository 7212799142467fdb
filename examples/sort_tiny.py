"""SORT on the offline tiny model, on CPU: all-wrong prompts are deferred, then repaired from their references.

The untrained tiny model never writes the right `\\boxed{}` answer, so every group is all-wrong: GRPO alone gets no
signal, while SORT buffers the prompts and, every time `repair_batch_size` of them are held, trains on their
reference solutions with plan-salience weights. The script prints the `sort/*` metrics of each step and the mean
step time with and without a repair.

    python examples/sort_tiny.py [--steps 8]
"""

import argparse
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from datasets import Dataset  # noqa: E402

from trl_mintrl import SORTConfig, SORTTrainer, cpu_training_fields  # noqa: E402
from trl_mintrl.tiny import build_tiny_model  # noqa: E402


def boxed_answer_reward(completions, answer, **kwargs):
    """1 when the last `\\boxed{...}` of the completion holds the expected answer, else 0."""
    rewards = []
    for completion, expected in zip(completions, answer):
        boxed = re.findall(r"\\boxed\{([^}]*)\}", completion[0]["content"])
        rewards.append(float(bool(boxed) and boxed[-1].strip() == expected))
    return rewards


def dataset(n: int = 16) -> Dataset:
    rows = []
    for i in range(n):
        a, b = 17 * i % 50, 29 * i % 40
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"Compute {a}+{b} and put the answer in \\boxed{{}}."}],
                "solution": f"{a}+{b}={a + b}\n\nThe final answer is \\boxed{{{a + b}}}.",
                "answer": str(a + b),
            }
        )
    return Dataset.from_list(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    cli = parser.parse_args()

    model_dir = build_tiny_model("outputs/tiny-model")
    args = SORTConfig(
        output_dir="outputs/sort-tiny",
        **cpu_training_fields(),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=32,
        max_steps=cli.steps,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-3,
        repair_batch_size=4,  # two prompts per step, all of them wrong: a repair every other step
        max_plan_tokens=32,
        max_reference_tokens=64,
        seed=0,
        disable_tqdm=True,
    )
    trainer = SORTTrainer(str(model_dir), reward_funcs=boxed_answer_reward, args=args, train_dataset=dataset())
    trainer.train()

    with_repair, without_repair = [], []
    for log in trainer.state.log_history:
        if "step_time" not in log:
            continue
        (with_repair if "sort/repair_loss" in log else without_repair).append(log["step_time"])
        sort_metrics = {k.removeprefix("sort/"): round(v, 4) for k, v in log.items() if k.startswith("sort/")}
        print(f"step {log['step']}: {sort_metrics}")
    for name, times in (("with a repair", with_repair), ("without", without_repair)):
        if times:
            print(f"mean step time {name}: {sum(times) / len(times):.3f} s over {len(times)} steps")


if __name__ == "__main__":
    main()
