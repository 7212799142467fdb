"""Who writes SORT's plan. By default the policy does (the paper: the current policy extracts a plan from the
reference with `plan_template`); a `Planner` object replaces it, for a plan written by another model, an API or code.

    from trl_mintrl.sort import FunctionPlanner, SORTTrainer

    trainer = SORTTrainer(..., planner=FunctionPlanner(lambda question, reference: "key step: ..."))

The plan is only context for the teacher scoring pass (`teacher_template`), never a training target, so a planner
changes which reference tokens SORT's weights find salient, not what is trained on.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

PlanFn = Callable[[str, str], str]


@dataclass(frozen=True)
class PlanRequest:
    """One repair item: the question (the prompt's last user message) and its reference solution."""

    question: str
    reference: str


@dataclass(frozen=True)
class Plan:
    """A plan, or `failed=True`: the item is still repaired, with an empty plan (no salience from the plan)."""

    text: str = ""
    failed: bool = False


class Planner(ABC):
    """Writes one plan per request, in order. A failure is a `Plan(failed=True)`, never an exception: it is counted
    in `sort/failed_plans` like a policy plan cut by `max_plan_tokens`."""

    @abstractmethod
    def plan(self, requests: list[PlanRequest]) -> list[Plan]: ...


class FunctionPlanner(Planner):
    """Calls `plan_fn(question, reference) -> str` once per item (a rule-based or programmatic planner).

    An exception or a non-string result makes that item `failed`; the first such problem of a batch is logged.
    """

    def __init__(self, plan_fn: PlanFn):
        if not callable(plan_fn):
            raise TypeError(f"FunctionPlanner `plan_fn` must be callable, got {type(plan_fn).__name__}")
        self.plan_fn = plan_fn

    def __repr__(self) -> str:
        return f"FunctionPlanner(plan_fn={getattr(self.plan_fn, '__qualname__', type(self.plan_fn).__name__)})"

    def plan(self, requests: list[PlanRequest]) -> list[Plan]:
        plans, problems = [], []
        for req in requests:
            try:
                text = self.plan_fn(req.question, req.reference)
            except Exception as err:  # user code: one bad item must not stop the repair
                problems.append(f"raised {type(err).__name__}: {err}")
                plans.append(Plan(failed=True))
                continue
            if isinstance(text, str):
                plans.append(Plan(text))
            else:
                problems.append(f"returned {type(text).__name__}, expected str")
                plans.append(Plan(failed=True))
        if problems:
            logger.warning(
                "FunctionPlanner plan_fn failed on %d of %d items; first: %s",
                len(problems),
                len(requests),
                problems[0],
            )
        return plans


def check_planner(planner) -> Planner | None:
    """`planner` if it is None (the policy writes the plans) or a `Planner`, else a TypeError naming the fix."""
    if planner is not None and not isinstance(planner, Planner):
        raise TypeError(
            f"`planner` must be a trl_mintrl.sort.Planner (e.g. FunctionPlanner(plan_fn)) or None for plans written "
            f"by the policy, got {type(planner).__name__}."
        )
    return planner
