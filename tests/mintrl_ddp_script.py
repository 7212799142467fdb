"""Run by tests/test_mintrl_ddp.py under `torchrun --nproc_per_node=2`: 2 MInTRL steps where each process holds
half of a group (per-device batch 2, group of 4), so control/intervened roles and baselines cross processes."""

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from mintrl_helpers import ONE_STEP_ROWS, multi_process_args, role_reward  # noqa: E402

from trl_mintrl import MInTRLTrainer  # noqa: E402
from trl_mintrl.cpu import exit_launched_process  # noqa: E402
from trl_mintrl.judges import FunctionJudge  # noqa: E402


class RecordingTrainer(MInTRLTrainer):
    def _score_batch(self, output, batch):
        super()._score_batch(output, batch)
        self.records = getattr(self, "records", [])
        self.records.append(
            {
                "rewards": batch.rewards(self.reward_weights).tolist(),
                "advantages": output["advantages"].tolist(),
                "judge_rows": (output["tool_mask"] == 0).any(dim=1).tolist(),
            }
        )


def main(model_path: str, out_dir: str):
    torch.manual_seed(0)
    args = multi_process_args(out_dir, max_reviews=1)
    judge = FunctionJudge(lambda q, p, steps, r: 0, lambda q, p, r: "1+1=2")
    trainer = RecordingTrainer(
        model_path, reward_funcs=role_reward, args=args, train_dataset=Dataset.from_list(ONE_STEP_ROWS), judge=judge
    )
    trainer.train()
    rank = trainer.accelerator.process_index
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "world": trainer.accelerator.num_processes,
                "records": trainer.records,
                "steps": trainer.state.global_step,
                "absorption": trainer.absorption.state_dict(),
            },
            f,
        )
    exit_launched_process(trainer)  # the script's last step: no gloo teardown (trl_mintrl.cpu)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
