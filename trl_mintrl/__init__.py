"""trl-mintrl: MInTRL and SORT as drop-in subclasses of TRL's `GRPOTrainer`."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from ._version import __version__

if sys.version_info < (3, 11):  # noqa: UP036 -- pip enforces requires-python; this catches source checkouts on sys.path
    raise ImportError(
        f"trl-mintrl needs Python >= 3.11 (this is {sys.version.split()[0]}). Create the environment with a newer "
        "interpreter, e.g. `python3.11 -m venv .venv`."
    )

# Trainers import TRL (and torch); load them on first use so `trl-mintrl --help` stays fast.
_LAZY = {
    "AsyncMInTRLConfig": "trl_mintrl.mintrl.async_",
    "AsyncMInTRLTrainer": "trl_mintrl.mintrl.async_",
    "MInTRLConfig": "trl_mintrl.mintrl",
    "MInTRLTrainer": "trl_mintrl.mintrl",
    "MInTRLSORTConfig": "trl_mintrl.combined",
    "MInTRLSORTTrainer": "trl_mintrl.combined",
    "SORTConfig": "trl_mintrl.sort",
    "SORTTrainer": "trl_mintrl.sort",
    "build_tiny_model": "trl_mintrl.tiny",
    "cpu_training_fields": "trl_mintrl.cpu",
    "exit_launched_process": "trl_mintrl.cpu",
}

__all__ = [
    "AsyncMInTRLConfig",
    "AsyncMInTRLTrainer",
    "MInTRLConfig",
    "MInTRLSORTConfig",
    "MInTRLSORTTrainer",
    "MInTRLTrainer",
    "SORTConfig",
    "SORTTrainer",
    "__version__",
    "build_tiny_model",
    "cpu_training_fields",
    "exit_launched_process",
]

if TYPE_CHECKING:
    from .combined import MInTRLSORTConfig, MInTRLSORTTrainer
    from .cpu import cpu_training_fields, exit_launched_process
    from .mintrl import MInTRLConfig, MInTRLTrainer
    from .mintrl.async_ import AsyncMInTRLConfig, AsyncMInTRLTrainer
    from .sort import SORTConfig, SORTTrainer
    from .tiny import build_tiny_model


def __dir__() -> list[str]:
    """The lazily loaded names too, so that tab completion and IDEs offer them before their first use."""
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_mintrl' has no attribute {name!r}")
