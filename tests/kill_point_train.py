"""`trl-mintrl train ...` that SIGKILLs itself at a chosen point, for tests/test_kill_resume.py.

`KILL_AT=POINT:STEP` picks where the process dies while it works on optimizer step STEP (global_step == STEP - 1):
- `generate`: inside the model's `generate` call of the rollout;
- `backward`: inside the backward pass (a gradient hook on the first trainable parameter);
- `save_weights`: while `checkpoint-STEP/model.safetensors` is written (the file is left half-written);
- `save_state`: while `checkpoint-STEP/trainer_state.json`, TRL's last file, is written (left half-written).
Nothing else is changed: the arguments go to `trl_mintrl.cli.train.main` as they would from the command line.
"""

from __future__ import annotations

import os
import signal
import sys

import safetensors.torch
import torch
import transformers
from transformers import GenerationMixin, Trainer, TrainerState

from trl_mintrl.cli.train import main

point, _, step = os.environ.get("KILL_AT", "none:0").partition(":")
KILL_STEP = int(step)
trainers: list[Trainer] = []


def at_kill_step() -> bool:
    return bool(trainers) and trainers[0].state.global_step == KILL_STEP - 1


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def cut_short(path: str) -> None:
    """Leave only the first half of a file written by a process that then dies."""
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    die()


original_train, original_generate = Trainer.train, GenerationMixin.generate
original_save_file, original_save_json = safetensors.torch.save_file, TrainerState.save_to_json


def train(self, *args, **kwargs):
    trainers.append(self)
    if point == "backward":
        first = next(p for p in self.model.parameters() if p.requires_grad)
        first.register_hook(lambda grad: die() if at_kill_step() else grad)
    return original_train(self, *args, **kwargs)


def generate(self, *args, **kwargs):
    if point == "generate" and at_kill_step():
        die()
    return original_generate(self, *args, **kwargs)


def save_file(tensors, filename, *args, **kwargs):
    original_save_file(tensors, filename, *args, **kwargs)
    if point == "save_weights" and f"checkpoint-{KILL_STEP}" in str(filename):
        cut_short(filename)


def save_to_json(self, json_path):
    original_save_json(self, json_path)
    if point == "save_state" and f"checkpoint-{KILL_STEP}" in str(json_path):
        cut_short(json_path)


if point != "none":
    Trainer.train, GenerationMixin.generate, TrainerState.save_to_json = train, generate, save_to_json
    safetensors.torch.save_file = save_file
    transformers.modeling_utils.safe_save_file = save_file  # the name save_pretrained calls
torch.set_num_threads(1)
main(sys.argv[1:])
