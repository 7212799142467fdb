"""Build the offline tiny model and run a short plain-GRPO training on CPU (the harness every trainer builds on)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from trl_mintrl.tiny import build_tiny_model  # noqa: E402


def digit_reward(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def main():
    model_dir = build_tiny_model("outputs/tiny-model")
    data = Dataset.from_list([{"prompt": f"Compute {a}+{a + 1} ="} for a in range(16)])
    args = GRPOConfig(
        output_dir="outputs/quickstart-grpo", use_cpu=True, bf16=False, gradient_checkpointing=False,
        report_to=[], per_device_train_batch_size=8, num_generations=4, max_completion_length=24,
        max_steps=4, logging_steps=1, save_strategy="no", learning_rate=1e-3,
    )
    trainer = GRPOTrainer(str(model_dir), reward_funcs=digit_reward, args=args, train_dataset=data)
    trainer.train()
    print("final reward:", trainer.state.log_history[-2].get("reward"))


if __name__ == "__main__":
    main()
