"""The tasks the studies train on: `toy` (a tiny model built offline) and `real` (SmolLM2-135M-Instruct on word problems)."""
