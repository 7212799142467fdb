"""A short SORT run, launched by tests/test_sort_ddp.py with `torchrun --nproc_per_node=2` (CPU, gloo) or under
`accelerate launch` with DeepSpeed ZeRO-2, and called in-process there as the single-process reference.

Setup: the 8 toy prompts, the first four "hard" (reward 0, so their groups are all-wrong), the others reward 1. Every
group then has zero advantage, so the GRPO gradient is exactly 0 and only repairs move the weights. The buffer
starts with three hard prompts and `repair_batch_size=3`, so step 1 repairs exactly those three whatever the number
of processes (with two, one process scores two items and the other one item plus a zero-weight copy). Plain SGD
without clipping makes the step-1 weight change proportional to the repair gradient, with either `repair_update`:
with "separate", the GRPO step moves nothing and the repair step that follows is the whole change. Four steps see every hard
prompt twice, so at least one more repair runs on deferred prompts.

Each process writes `rank{R}.json` (repairs after each step, final buffer, hash of the final weights) and
`rank{R}_step1_delta.pt` (weight change of step 1) to the output folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

for key, value in {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(key, value)

import torch  # noqa: E402
from conftest import toy_rows  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from trl_mintrl.cpu import cpu_training_fields  # noqa: E402
from trl_mintrl.sort import SORTConfig, SORTTrainer  # noqa: E402

HARD = {f"Compute {a}+{(a * 3) % 7} =" for a in range(4)}


def flat_reward(prompts, completions, **kwargs):
    return [0.0 if p[-1]["content"] in HARD else 1.0 for p in prompts]


class Recorder(TrainerCallback):
    def __init__(self, trainer):
        self.trainer, self.repairs_after_step, self.step1_delta = trainer, [], None
        self.start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    def on_step_end(self, args, state, control, **kwargs):
        self.repairs_after_step.append(self.trainer.repair.buffer.counters["repairs"])
        if state.global_step == 1:
            params = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped).named_parameters()
            self.step1_delta = {n: p.detach() - self.start[n] for n, p in params}


def run(model_path: str, out_dir: str, max_steps: int = 4, repair_update: str = "separate") -> dict:
    data = Dataset.from_list(toy_rows())
    args = SORTConfig(
        output_dir=os.path.join(out_dir, "trainer"),
        **cpu_training_fields(),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="no",
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=0.0,
        repair_batch_size=3,
        repair_update=repair_update,
        max_plan_tokens=8,
        seed=0,
        disable_tqdm=True,
    )
    trainer = SORTTrainer(model_path, reward_funcs=flat_reward, args=args, train_dataset=data)
    for row in [r for r in data if r["prompt"][-1]["content"] in HARD][:3]:
        trainer.repair.buffer.add(row["prompt"], row["solution"])
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()

    rank = trainer.accelerator.process_index
    weights = hashlib.sha256()
    for _, p in sorted(trainer.model.named_parameters()):
        weights.update(p.detach().cpu().numpy().tobytes())
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "deepspeed": trainer.is_deepspeed_enabled,
        "repairs_after_step": recorder.repairs_after_step,
        "buffer": trainer.repair.buffer.state_dict(),
        "weights_sha256": weights.hexdigest(),
    }
    os.makedirs(out_dir, exist_ok=True)
    torch.save(recorder.step1_delta, os.path.join(out_dir, f"rank{rank}_step1_delta.pt"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--repair-update", default="separate", choices=["separate", "joint"])
    cli = parser.parse_args()
    torch.set_num_threads(1)
    run(cli.model, cli.out, repair_update=cli.repair_update)
