"""MInTRL on the offline tiny model with a rule-based judge, on CPU in about a minute.

The judge is a `FunctionJudge`: it flags the first step that is less than 60% digits and corrects it with the
reference solution's first line; the reward is the share of digits, so corrected rollouts tend to score higher. Swap it for `judge="self"` / `"model"` / `"endpoint"` in the config to use an LLM.

    python examples/mintrl_tiny.py
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from datasets import Dataset  # noqa: E402

from trl_mintrl import MInTRLConfig, MInTRLTrainer, cpu_training_fields  # noqa: E402
from trl_mintrl.judges import FunctionJudge  # noqa: E402
from trl_mintrl.tiny import build_tiny_model  # noqa: E402


def share_of_digits(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def review(question, prefix, steps, reference):
    """Earliest step that is mostly not digits, or None."""
    return next((i for i, step in enumerate(steps) if share_of_digits(step) < 0.6), None)


def correct(question, prefix, reference):
    return reference.split("\n\n")[0] + "\n\n"


def digit_share(completions, **kwargs):
    return [share_of_digits(c[0]["content"]) for c in completions]


def main():
    model_dir = build_tiny_model("outputs/tiny-model")
    rows = [
        {"prompt": [{"role": "user", "content": f"Compute {a}+{b} ="}], "solution": f"{a}+{b}={a + b}\n\n{a + b}"}
        for a in range(8)
        for b in range(3)
    ]
    args = MInTRLConfig(
        output_dir="outputs/mintrl-tiny",
        **cpu_training_fields(),
        num_control_generations=4,
        num_intervened_generations=4,
        per_device_train_batch_size=16,
        max_completion_length=32,
        chunk_size=8,
        max_reviews=2,
        max_correction_tokens=16,
        intervention_steps=4,
        max_steps=6,
        learning_rate=5e-4,
        logging_steps=1,
        save_strategy="no",
    )
    trainer = MInTRLTrainer(
        str(model_dir),
        reward_funcs=digit_share,
        args=args,
        train_dataset=Dataset.from_list(rows),
        judge=FunctionJudge(review, correct),
    )
    trainer.train()
    keys = [
        "reward",
        "mintrl/reward_control",
        "mintrl/reward_intervened",
        "mintrl/intervention_rate",
        "mintrl/judge_token_frac",
        "mintrl/regression_residual",
    ]
    print("step | " + " | ".join(keys))
    for entry in trainer.state.log_history:
        if "reward" in entry:
            print(f"{entry['step']:>4} | " + " | ".join(f"{entry.get(k, float('nan')):.3f}" for k in keys))


if __name__ == "__main__":
    main()
