"""Training on CPUs: the config fields a TRL `GRPOConfig`-based config needs, and the clean end of a multi-process
(gloo) launch."""

from __future__ import annotations

import os
import sys

from transformers import TrainingArguments

# transformers 5.24 renamed `gradient_checkpointing` to `activation_checkpointing` (the old name warns and stays an
# alias); earlier 5.x releases, which `transformers>=5.0` allows, know only the old name
_CHECKPOINTING = (
    "activation_checkpointing" if hasattr(TrainingArguments, "activation_checkpointing") else "gradient_checkpointing"
)


def cpu_training_fields(**overrides) -> dict:
    """The fields any TRL `GRPOConfig`-based config (`GRPOConfig`, `MInTRLConfig`, `SORTConfig`, `MInTRLSORTConfig`,
    `AsyncMInTRLConfig`) needs to train on a CPU; `overrides` win:

    - `use_cpu=True`;
    - `bf16=False`: TRL defaults bf16 on, and a CPU cannot train in it;
    - activation checkpointing off (TRL defaults it on): `activation_checkpointing=False`, or
      `gradient_checkpointing=False` on a transformers release older than 5.24. To turn it on, override that same
      field: once the new name is set, transformers ignores the deprecated one;
    - `report_to=[]`: no experiment trackers.

        MInTRLConfig(**cpu_training_fields(output_dir="out", max_steps=2))
    """
    return {"use_cpu": True, "bf16": False, _CHECKPOINTING: False, "report_to": []} | overrides


def exit_launched_process(*keep_alive: object) -> None:
    """End a process of a multi-process launch (`torchrun`, `accelerate launch`) without the interpreter's native
    teardown; call it as a script's last step, passing the trainer.

    Gloo's worker threads outlive `destroy_process_group` (the process group stays referenced), and tearing them
    down intermittently hangs a rank for good or aborts it ("terminate called without an active exception",
    SIGABRT, after the model was saved): during interpreter finalization, or as soon as the trained model is freed
    (its DDP reducer holds the group: a rank was seen blocked in `~ProcessGroupGloo` when its trainer was dropped).
    So the objects in `keep_alive` stay referenced until the end, the Python-level exit work runs here (other
    threads are joined, atexit handlers run, output is flushed), and the process ends with `os._exit(0)`. Outside a
    multi-process launch (`WORLD_SIZE` unset or 1) it returns and the interpreter exits as usual.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # `keep_alive`, referenced by this frame, is never freed
