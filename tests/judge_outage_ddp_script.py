"""Run by tests/test_judge_outage.py under `torchrun --nproc_per_node=2`: an endpoint judge nobody answers, with
rank 0 holding only controls (it never calls the judge) and rank 1 the intervened rollouts. Each rank writes how
far it trained and the error that stopped it."""

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
from trl_mintrl.mintrl.judge_watch import JudgeOutageError  # noqa: E402


def main(model_path: str, out_dir: str, judge_url: str):
    torch.manual_seed(0)
    args = multi_process_args(
        out_dir, max_steps=3, judge="endpoint", judge_base_url=judge_url, judge_model="judge",
        judge_check_endpoint=False, judge_max_retries=0, judge_outage_steps=1,
    )  # fmt: skip
    trainer = MInTRLTrainer(
        model_path, reward_funcs=role_reward, args=args, train_dataset=Dataset.from_list(ONE_STEP_ROWS)
    )
    error = None
    try:
        trainer.train()
    except JudgeOutageError as err:
        error = str(err)
    rank = trainer.accelerator.process_index
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": trainer.state.global_step, "error": error, "judge_sent": trainer.judge.sent}, f)
    exit_launched_process(trainer)  # the script's last step: no gloo teardown (trl_mintrl.cpu)


if __name__ == "__main__":
    main(*sys.argv[1:4])
