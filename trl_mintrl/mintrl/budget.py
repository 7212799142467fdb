"""Intervention budget controller: holds the judge-token share of the completions near `judge_token_target`.

The actuator is the share of intervened slots that are really reviewed (the others run as on-policy controls). The
judge-token share is close to proportional to it (each reviewed rollout gets the same treatment, `max_reviews`
reviews), so a multiplicative step on the log of the share converges in a few steps and does not change what an
intervened rollout is: the reward gap that `intervention_stop_gap` watches stays comparable from step to step.
The first step with judge tokens is a full proportional step (`target / measured`, not damped or clamped): the
controller starts with every slot reviewed, where a short answer can be half judge text, and damped steps of at most
x2 would spend the first 4-5 intervention steps far above a target like the paper's 3%, the intensity that hurts.
Reviews per rollout would be a coarser (integer) and non-linear actuator: later chunks are revised less often.

The functions are pure; the trainer calls them with statistics gathered over all processes, so every process takes
the same decision.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

CONTROLLER_GAIN = 0.5  # half the log-error per step: fast, and damped against the noise of one batch's share
MAX_STEP = 2.0  # the share changes by at most x2 or /2 per step (a step with no judge tokens at all doubles it)
MIN_SHARE = 1e-3  # a multiplicative controller at 0 could never come back


def next_intervention_share(share: float, measured: float, target: float, first: bool = False) -> float:
    """The share of intervened slots to review next step, given the judge-token share `measured` at `share`:
    `share * (target / measured) ** CONTROLLER_GAIN`, the factor clamped to [1/MAX_STEP, MAX_STEP], the result to
    [MIN_SHARE, 1]. `first` (the first measured step): the full factor `target / measured`, unclamped."""
    if first and measured > 0:
        return min(max(share * target / measured, MIN_SHARE), 1.0)
    factor = MAX_STEP if measured <= 0 else (target / measured) ** CONTROLLER_GAIN
    factor = min(max(factor, 1.0 / MAX_STEP), MAX_STEP)
    return min(max(share * factor, MIN_SHARE), 1.0)


def reviewed_slot_count(share: float, slots: int, carry: float) -> tuple[int, float]:
    """How many of `slots` intervened slots to review at `share`, and the fraction carried to the next batch, so
    that a share below 1/slots still reviews some rollouts on average (error diffusion across steps)."""
    wanted = share * slots + carry
    count = min(math.floor(wanted + 1e-9), slots)
    return count, wanted - count


def reviewed_slots(count: int, slots: int) -> list[bool]:
    """Which of `slots` ordered slots are reviewed when `count` of them are: spread evenly, so each group of the
    batch gets its share (slot j is reviewed when floor((j+1) * count / slots) steps up)."""
    return [(j + 1) * count // slots > j * count // slots for j in range(slots)]


@dataclass
class BudgetState:
    """The controller's state, saved with checkpoints: the current share, the carried fraction of a slot, and whether
    a step with judge tokens has set the share yet (the first one is a full proportional step)."""

    share: float = 1.0
    carry: float = 0.0
    measured: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict) -> BudgetState:
        # checkpoints written before `measured` existed: their controller had stepped, damped, from the start
        return cls(
            share=float(state["share"]), carry=float(state["carry"]), measured=bool(state.get("measured", True))
        )
