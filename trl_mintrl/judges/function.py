"""A judge made of two plain Python functions: rule-based or programmatic checkers (arithmetic, unit tests)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

from .base import Correction, CorrectionRequest, Judge, ReviewRequest, Verdict

logger = logging.getLogger(__name__)

ReviewFn = Callable[[str, str, list[str], str | None], int | None]
CorrectFn = Callable[[str, str, str | None], str]


class FunctionJudge(Judge):
    """Calls `review_fn` / `correct_fn` once per item.

    Args:
        review_fn: `(question, prefix, steps, reference) -> int | None`, the 0-based index of the earliest wrong step
            or None to keep the chunk.
        correct_fn: `(question, prefix, reference) -> str`, the correction text (used verbatim).
        concurrent_batches: batches the continuous rollout may run at once, each on its own worker thread. Raise it
            for thread-safe functions that wait (run unit tests in a subprocess, call a service); pure-Python
            checks gain nothing (one interpreter lock), and 1 keeps functions that are not thread-safe safe.

    Either function that takes a `conversation` keyword also gets the request's `conversation` (with tools: the
    rollout's earlier turns and tool results, see `ReviewRequest`), so a judge can read tool feedback.

    An exception, a non-integer or an out-of-range index, or a non-string correction makes that item `failed`; the
    first such problem of a batch is logged.
    """

    def __init__(self, review_fn: ReviewFn, correct_fn: CorrectFn, *, concurrent_batches: int = 1):
        if not isinstance(concurrent_batches, int) or concurrent_batches < 1:
            raise ValueError(
                f"FunctionJudge `concurrent_batches` must be a positive integer, got {concurrent_batches!r}"
            )
        for name, fn in (("review_fn", review_fn), ("correct_fn", correct_fn)):
            if not callable(fn):
                raise TypeError(f"FunctionJudge `{name}` must be callable, got {type(fn).__name__}")
        self.review_fn = review_fn
        self.correct_fn = correct_fn
        self.concurrent_batches = concurrent_batches
        self._review_reads_conversation = _takes_conversation(review_fn)
        self._correct_reads_conversation = _takes_conversation(correct_fn)

    def __repr__(self) -> str:
        return f"FunctionJudge(review_fn={_name(self.review_fn)}, correct_fn={_name(self.correct_fn)})"

    def review(self, requests: list[ReviewRequest]) -> list[Verdict]:
        verdicts, problems = [], []
        for req in requests:
            try:
                extra = {"conversation": req.conversation} if self._review_reads_conversation else {}
                index = self.review_fn(req.question, req.prefix, list(req.steps), req.reference, **extra)
            except Exception as err:  # user code: one bad item must not stop the rollout
                problems.append(f"raised {type(err).__name__}: {err}")
                verdicts.append(Verdict(failed=True))
                continue
            if index is None:
                verdicts.append(Verdict())
            elif isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(req.steps):
                problems.append(f"returned {index!r} for {len(req.steps)} steps (expected None or 0..n-1)")
                verdicts.append(Verdict(failed=True))
            else:
                verdicts.append(Verdict(wrong_step=index))
        _log_problems("review_fn", problems, len(requests))
        return verdicts

    def correct(self, requests: list[CorrectionRequest]) -> list[Correction]:
        corrections, problems = [], []
        for req in requests:
            try:
                extra = {"conversation": req.conversation} if self._correct_reads_conversation else {}
                text = self.correct_fn(req.question, req.prefix, req.reference, **extra)
            except Exception as err:  # user code: one bad item must not stop the rollout
                problems.append(f"raised {type(err).__name__}: {err}")
                corrections.append(Correction(failed=True))
                continue
            if isinstance(text, str):
                corrections.append(Correction(text))
            else:
                problems.append(f"returned {type(text).__name__}, expected str")
                corrections.append(Correction(failed=True))
        _log_problems("correct_fn", problems, len(requests))
        return corrections


def _takes_conversation(fn) -> bool:
    """`fn` has a parameter named `conversation`; a callable whose signature cannot be read has not."""
    try:
        return "conversation" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _name(fn) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


def _log_problems(fn_name: str, problems: list[str], total: int) -> None:
    if problems:
        logger.warning(
            "FunctionJudge %s failed on %d of %d items; first: %s", fn_name, len(problems), total, problems[0]
        )
