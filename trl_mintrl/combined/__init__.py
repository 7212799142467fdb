"""MInTRL + SORT in one run: judge interventions and advantage regression, plus SORT's repair of all-wrong groups."""

from .config import MInTRLSORTConfig
from .trainer import MInTRLSORTTrainer

__all__ = ["MInTRLSORTConfig", "MInTRLSORTTrainer"]
