"""Run by tests/test_budget_controller.py under `torchrun --nproc_per_node=2`: 3 MInTRL steps with
`judge_token_target`, per-device batch 6 and groups of 4 (1 control + 3 intervened), so a group spans the two
processes. Each process records its rows' roles and the controller's state after each step."""

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from mintrl_helpers import ONE_STEP_ROWS, multi_process_args  # noqa: E402

from trl_mintrl import MInTRLTrainer  # noqa: E402
from trl_mintrl.cpu import exit_launched_process  # noqa: E402
from trl_mintrl.judges import FunctionJudge  # noqa: E402


class RecordingTrainer(MInTRLTrainer):
    def _score_batch(self, output, batch):
        share_used = self.schedule.intervention_budget.share
        super()._score_batch(output, batch)
        self.records = getattr(self, "records", [])
        local = self.process_slice(len(batch.inputs))
        self.records.append(
            {
                "share_used": share_used,
                "budget": self.schedule.intervention_budget.to_dict(),
                "reviewed": (~batch.rollout.is_control).tolist(),
                "judge_rows": (output["tool_mask"] == 0).any(dim=1).tolist(),
                "first_row": local.start,
            }
        )


def main(model_path: str, out_dir: str):
    torch.manual_seed(0)
    args = multi_process_args(
        out_dir,
        num_control_generations=1,
        num_intervened_generations=3,
        per_device_train_batch_size=6,
        max_completion_length=16,
        max_reviews=1,
        max_steps=3,
        judge_token_target=0.05,
    )
    judge = FunctionJudge(lambda q, p, steps, r: 0, lambda q, p, r: "1+1=2")
    trainer = RecordingTrainer(
        model_path,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list(ONE_STEP_ROWS),
        judge=judge,
    )
    trainer.train()
    rank = trainer.accelerator.process_index
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"world": trainer.accelerator.num_processes, "records": trainer.records}, f)
    exit_launched_process(trainer)  # the script's last step: no gloo teardown (trl_mintrl.cpu)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
