"""Asynchronous MInTRL on TRL's `AsyncGRPOTrainer` (`trl.experimental.async_grpo`): generation, judging and training
overlap, and a rollout written by older weights is regressed as it is."""

from .collator import MInTRLRolloutCollator, SampleMetrics
from .config import AsyncMInTRLConfig
from .trainer import AsyncMInTRLTrainer

__all__ = ["AsyncMInTRLConfig", "AsyncMInTRLTrainer", "MInTRLRolloutCollator", "SampleMetrics"]
