"""trl-mintrl: MInTRL and SORT as drop-in subclasses of TRL's `GRPOTrainer`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Trainers import TRL (and torch); load them on first use so `trl-mintrl --help` stays fast.
_LAZY = {
    "MInTRLConfig": "trl_mintrl.mintrl",
    "MInTRLTrainer": "trl_mintrl.mintrl",
    "SORTConfig": "trl_mintrl.sort",
    "SORTTrainer": "trl_mintrl.sort",
    "build_tiny_model": "trl_mintrl.tiny",
}

__all__ = ["MInTRLConfig", "MInTRLTrainer", "SORTConfig", "SORTTrainer", "__version__", "build_tiny_model"]

if TYPE_CHECKING:
    from .mintrl import MInTRLConfig, MInTRLTrainer
    from .sort import SORTConfig, SORTTrainer
    from .tiny import build_tiny_model


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_mintrl' has no attribute {name!r}")
