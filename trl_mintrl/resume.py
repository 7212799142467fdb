"""Which checkpoint a run resumes from: the last *complete* one, never a folder a kill cut short.

transformers' `get_last_checkpoint` picks the highest `checkpoint-N` by number alone, so a run killed while writing
`checkpoint-7` fails to resume (or resumes from half a folder). A checkpoint is complete when everything a resume
reads is there and whole: TRL's `trainer_state.json`, written last, parses and names step N; the weights are
present and every `.safetensors` file is as long as its header says; and the trainer's extra state file (MInTRL's
schedule, SORT's buffer, written before TRL's files) parses. Used by `trl-mintrl train --resume_from_checkpoint true`
and by `MInTRLTrainer` / `SORTTrainer.train(resume_from_checkpoint=True)`.

A checkpoint of a run that already finished is resumed to nothing (`finished_run`): transformers' `Trainer` would
train one step past the end and, with `save_total_limit`, delete the checkpoint it resumed from (docs/training.md,
"Known issues").
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
# one of these holds the weights (full model, sharded model, PEFT adapter, FSDP shards, DeepSpeed folder)
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
            "adapter_model.safetensors", "adapter_model.bin")  # fmt: skip


def _json_problem(path: str) -> str | None:
    if not os.path.isfile(path):
        return f"{os.path.basename(path)} is missing"
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as err:
        return f"{os.path.basename(path)} is not valid JSON ({err})"
    return None if isinstance(value, dict) else f"{os.path.basename(path)} is not a JSON object"


def _safetensors_problem(path: str) -> str | None:
    """A file cut short: shorter than its header's last tensor end (the header is 8 bytes of length, then JSON)."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if header_len <= 0 or 8 + header_len > size:
                return f"{os.path.basename(path)} is truncated ({size} bytes)"
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as err:
        return f"{os.path.basename(path)} has an unreadable header ({err})"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    return None if 8 + header_len + end <= size else f"{os.path.basename(path)} is truncated ({size} bytes)"


def checkpoint_problem(folder: str, extra_state_files: Sequence[str] = ()) -> str | None:
    """Why `folder` cannot be resumed from, or None when it is complete."""
    state_path = os.path.join(folder, TRAINER_STATE)
    problem = _json_problem(state_path)
    if problem:
        return problem
    match = _CHECKPOINT.match(os.path.basename(os.path.normpath(folder)))
    with open(state_path, encoding="utf-8") as f:
        step = json.load(f).get("global_step")
    if match and step != int(match.group(1)):
        return f"{TRAINER_STATE} is for step {step}, not {match.group(1)}"
    names = os.listdir(folder)
    sharded = any(n.startswith(("pytorch_model_fsdp", "global_step")) for n in names)  # FSDP / DeepSpeed states
    if not sharded and not any(n in names for n in _WEIGHTS):
        return "it holds no model weights"
    for name in sorted(n for n in names if n.endswith(".safetensors")):
        problem = _safetensors_problem(os.path.join(folder, name))
        if problem:
            return problem
    for name in extra_state_files:
        problem = _json_problem(os.path.join(folder, name))
        if problem:
            return problem
    return None


def numbered_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """(step, folder) of every `checkpoint-N` folder in `output_dir`, complete or not, by step."""
    if not os.path.isdir(output_dir):
        return []
    numbered = [(int(m.group(1)), name) for name in os.listdir(output_dir) if (m := _CHECKPOINT.match(name))]
    folders = [(step, os.path.join(output_dir, name)) for step, name in sorted(numbered)]
    return [(step, folder) for step, folder in folders if os.path.isdir(folder)]


def last_complete_checkpoint(output_dir: str, extra_state_files: Sequence[str] = ()) -> str | None:
    """The highest-numbered complete `checkpoint-N` folder in `output_dir` (None if there is none); each newer,
    incomplete one is skipped with a warning that says why."""
    for _, folder in reversed(numbered_checkpoints(output_dir)):
        problem = checkpoint_problem(folder, extra_state_files)
        if problem is None:
            return folder
        logger.warning(
            "Skipping %s: incomplete (%s), probably cut short by a crash while it was written.", folder, problem
        )
    return None


def resolve_resume_from_checkpoint(
    value: str | bool | None, output_dir: str, extra_state_files: Sequence[str] = ()
) -> str | None:
    """`resume_from_checkpoint` as a user gives it (True or "true": the last complete checkpoint of `output_dir`;
    a folder; None, False or "false": start afresh) -> the folder to resume from, or None. Raises `ValueError` naming
    the problem when there is nothing complete to resume from."""
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "y", "1", "false", "no", "n", "0", ""):
        value = value.strip().lower() in ("true", "yes", "y", "1")
    if value is None or value is False:
        return None
    if value is True:
        folder = last_complete_checkpoint(output_dir, extra_state_files)
        if folder is None:
            raise ValueError(
                f"resume_from_checkpoint=true: no complete checkpoint-N folder in output_dir={output_dir!r} (see the "
                "warnings above for incomplete ones). Point resume_from_checkpoint to a checkpoint folder, or leave it "
                "unset to start a new run."
            )
        logger.info("Resuming from %s, the last complete checkpoint in %s.", folder, output_dir)
        return folder
    if not os.path.isdir(value):
        raise ValueError(f"resume_from_checkpoint={value!r}: no such folder. Give a checkpoint-N folder or true.")
    problem = checkpoint_problem(value, extra_state_files)
    if problem:
        raise ValueError(
            f"resume_from_checkpoint={value!r} is incomplete: {problem}. Resume from an earlier checkpoint, or use "
            "resume_from_checkpoint=true to pick the last complete one."
        )
    return value


def finished_run(checkpoint: str, max_steps: int, num_train_epochs: float) -> str | None:
    """A line saying there is nothing left to train when `checkpoint` is already at the end of the run that
    `max_steps` (> 0) or else `num_train_epochs` describes; None when training goes on from it."""
    with open(os.path.join(checkpoint, TRAINER_STATE), encoding="utf-8") as f:
        state = json.load(f)
    step, epoch = state.get("global_step", 0), state.get("epoch") or 0.0
    if max_steps > 0:
        if step < max_steps:
            return None
        end = f"max_steps={max_steps}"
    elif epoch >= num_train_epochs - 1e-6:  # the epoch is step / steps_in_epoch, a float
        end = f"num_train_epochs={num_train_epochs:g}"
    else:
        return None
    return (
        f"Nothing to resume: {checkpoint} is at step {step} (epoch {epoch:g}), the end of the run ({end}), so no "
        "step is trained and no checkpoint is removed. Raise max_steps (or num_train_epochs) to train further."
    )
