"""The config fields that make a TRL `GRPOConfig`-based config train on a CPU."""

from __future__ import annotations

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
