"""MInTRL: judge interventions during rollout + sequence-level advantage regression."""

from .config import MInTRLConfig
from .continuous import ContinuousRollout
from .judge_factory import build_judge
from .rollout import InterventionRollout, RolloutSettings, Trajectory
from .steps import split_steps
from .trainer import MInTRLTrainer

__all__ = [
    "ContinuousRollout",
    "InterventionRollout",
    "MInTRLConfig",
    "MInTRLTrainer",
    "RolloutSettings",
    "Trajectory",
    "build_judge",
    "split_steps",
]
