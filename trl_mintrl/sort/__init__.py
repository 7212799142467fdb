"""SORT: Selective Off-policy Reference Tuning (arXiv 2605.11505) as a drop-in `GRPOTrainer` subclass."""

from .buffer import RepairBuffer, RepairItem, classify_groups
from .config import SORTConfig
from .planner import FunctionPlanner, Plan, Planner, PlanRequest
from .trainer import SORTTrainer

__all__ = [
    "FunctionPlanner",
    "Plan",
    "PlanRequest",
    "Planner",
    "RepairBuffer",
    "RepairItem",
    "SORTConfig",
    "SORTTrainer",
    "classify_groups",
]
