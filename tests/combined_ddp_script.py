"""Run by tests/test_combined_trainer.py under `torchrun --nproc_per_node=2`: MInTRL + SORT where each process holds
half of every group (per-device batch 2, 2 controls + 2 intervened rollouts), so the all-wrong decision needs the
other process's rewards: rank 0 holds the controls, which fail on every prompt, rank 1 the intervened rollouts,
which rescue the easy ones. Each rank writes what it deferred, its rewards, its buffer, repairs after each step and
its final weights to `rank{R}.json`."""

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from conftest import toy_rows  # noqa: E402
from datasets import Dataset  # noqa: E402
from test_combined_trainer import RescueReward, StepSpy, combined_args, make_trainer, record_deferrals  # noqa: E402

from trl_mintrl.cpu import exit_launched_process  # noqa: E402


def main(model_path: str, out_dir: str):
    torch.manual_seed(0)
    base = dict(output_dir=os.path.join(out_dir, "trainer"), use_cpu=True, bf16=False, report_to=[],
                logging_steps=1, save_strategy="no", learning_rate=1e-3, seed=0, disable_tqdm=True)  # fmt: skip
    args = combined_args(base, per_device_train_batch_size=2, max_steps=6, repair_batch_size=2)
    reward, spy = RescueReward(), StepSpy()
    trainer = make_trainer(model_path, args, Dataset.from_list(toy_rows()), reward, callbacks=[spy])
    spy.trainer = trainer
    deferred = record_deferrals(trainer)
    trainer.train()
    rank = trainer.accelerator.process_index
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "world": trainer.accelerator.num_processes,
                "rewards_seen": reward.seen,  # this process's rows only
                "deferred": deferred,
                "buffer": trainer.repair.buffer.state_dict(),
                "repairs_after_step": spy.repairs,
                "weights": [p.detach().double().sum().item() for _, p in sorted(trainer.model.named_parameters())],
            },
            f,
        )
    exit_launched_process(trainer)  # the script's last step: no gloo teardown (trl_mintrl.cpu)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
