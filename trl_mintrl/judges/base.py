"""The batched judge interface that MInTRL's rollout loop calls.

One `review` call and one `correct` call per rollout round serve the whole batch of trajectories. A judge never
raises for a single bad item: a failed item (timeout, HTTP error, unparseable or out-of-range verdict, exception in
user code) comes back marked `failed`, and the rollout loop treats it as KEEP and counts it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass
class ReviewRequest:
    """Review the new steps of one trajectory.

    Attributes:
        question: the prompt text (for conversational prompts, the content of the last user message).
        prefix: the completion text accepted so far (judge corrections included).
        steps: the new chunk split into steps; `"".join(steps)` is the chunk's text.
        reference: the reference solution, when the dataset has one (privileged context for the judge).
        last_step_complete: False when the chunk was cut by the chunk size, so its last step may be unfinished and
            must not be flagged merely for being incomplete.
    """

    question: str
    prefix: str
    steps: list[str]
    reference: str | None = None
    last_step_complete: bool = True


@dataclass
class CorrectionRequest:
    """Write the next short piece of a trajectory, continuing `prefix` (already cut before the wrong step)."""

    question: str
    prefix: str
    reference: str | None = None


@dataclass
class Verdict:
    """`wrong_step`: 0-based index of the earliest wrong step, or None (KEEP). `failed`: the judge could not
    answer (counted as KEEP by the caller)."""

    wrong_step: int | None = None
    failed: bool = False


@dataclass
class Correction:
    """`text`: the correction (may be empty). `failed`: the judge could not answer; the caller keeps the chunk."""

    text: str = ""
    failed: bool = False


class Judge(ABC):
    """Reviews and corrects batches of trajectories. Implementations batch internally (one model call, or bounded
    concurrent HTTP requests) and return one result per request, in order."""

    @abstractmethod
    def review(self, requests: list[ReviewRequest]) -> list[Verdict]: ...

    @abstractmethod
    def correct(self, requests: list[CorrectionRequest]) -> list[Correction]: ...

    def state_dict(self) -> dict:
        """Judge state to save with checkpoints (e.g. counters); stateless judges return {}."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (stateless judges restore nothing)
        """Restore what `state_dict` returned."""
