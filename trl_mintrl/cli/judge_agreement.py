"""`trl-mintrl judge-check --reference_judge`: the checked judge's reviews against a reference judge's on the same
chunks (REVISE precision and recall, first wrong step, decision agreement, the checked judge's failures)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..judges.base import Judge, ReviewRequest, Verdict, VoteTally, tally_votes
from .recipe import RecipeError, import_dotted, recipe_folders


def build_reference_judge(path: str, config_path: str | None) -> Judge:
    """The judge `--reference_judge PATH` names: PATH is imported as the recipe's `judge_function` is (from the
    working folder, then the recipe's folder and its parents) and called with no arguments."""
    fix = (
        "give the dotted path of a zero-argument factory returning a trl_mintrl.judges.Judge, as for the recipe's "
        "judge_function (e.g. --reference_judge benchmarks.tasks.real.judge.rule_judge)"
    )
    if not path or "." not in path.replace(":", "."):
        raise RecipeError(f"--reference_judge {path!r}: not a dotted path; {fix}.")
    try:
        factory = import_dotted(path, recipe_folders(config_path))
    except (ImportError, AttributeError, ValueError) as err:
        raise RecipeError(f"--reference_judge {path!r}: cannot import it ({err}); {fix}.") from None
    if not callable(factory):
        raise RecipeError(f"--reference_judge {path!r}: {type(factory).__name__} is not callable; {fix}.")
    try:
        judge = factory()
    except Exception as err:  # user code: name it, with the fix
        raise RecipeError(
            f"--reference_judge {path!r}: calling it with no arguments raised {type(err).__name__}: {err}; {fix}."
        ) from None
    if not isinstance(judge, Judge):
        raise RecipeError(f"--reference_judge {path!r}: it returned a {type(judge).__name__}, not a Judge; {fix}.")
    return judge


def reference_verdicts(reference: Judge, rounds: list[list[ReviewRequest]]) -> tuple[dict[int, Verdict], str | None]:
    """The reference judge's verdict on each recorded request (by `id`), asked once per round with the round's
    requests, in the order the checked judge got them; and the first error of a round whose call raised (its
    requests count as failed: the reference could not answer them)."""
    answers: dict[int, Verdict] = {}
    error = None
    for requests in rounds:
        try:
            verdicts = reference.review(requests)
            if len(verdicts) != len(requests):
                raise RuntimeError(f"returned {len(verdicts)} verdicts for {len(requests)} requests")
        except Exception as err:  # a reference that breaks leaves its reviews uncompared, named in the report
            error = error or f"{reference!r}.review raised {type(err).__name__}: {err}"
            verdicts = [Verdict(failed=True)] * len(requests)
        answers.update(zip(map(id, requests), verdicts, strict=True))
    return answers, error


def _decision(verdict: VoteTally) -> int | str | None:
    """A decision as the JSON report writes it: the 0-based wrong step, None (KEEP) or "failed"."""
    return "failed" if verdict.usable == 0 else verdict.wrong_step


@dataclass
class Agreement:
    """The checked judge's decisions against the reference's, one per reviewed chunk. A REVISE is a positive. The
    checked judge's decision is the one the rollout took (`tally_votes` of its votes): a chunk whose reviews all
    failed counts as KEEP, as training takes it (`checked_failed` counts those). Chunks the reference could not
    answer are left out (`reference_failed`)."""

    reference_judge: str  # its repr
    chunks: int = 0  # reviewed chunks
    reference_failed: int = 0  # left out: the reference's answer failed
    both_revise: int = 0  # true positives
    only_checked: int = 0  # false positives: the checked judge revises, the reference keeps
    only_reference: int = 0  # false negatives: the reference revises, the checked judge keeps (or failed)
    both_keep: int = 0  # true negatives
    checked_failed: int = 0  # compared chunks whose checked reviews all failed (KEEP)
    checked_failed_reference_revise: int = 0  # of those, the reference revises
    same_step: int = 0  # both revise, at the same step
    checked_earlier: int = 0  # both revise, the checked judge at an earlier step
    checked_later: int = 0
    reference_error: str | None = None
    reviews: list[dict] = field(default_factory=list)  # every chunk: request and both decisions

    @property
    def compared(self) -> int:
        return self.chunks - self.reference_failed

    @property
    def precision(self) -> float | None:
        """Of the checked judge's REVISE, the share the reference also revises."""
        flagged = self.both_revise + self.only_checked
        return self.both_revise / flagged if flagged else None

    @property
    def recall(self) -> float | None:
        """Of the reference's REVISE, the share the checked judge also revises."""
        wrong = self.both_revise + self.only_reference
        return self.both_revise / wrong if wrong else None

    @property
    def agreement(self) -> float | None:
        """The share of compared chunks where both decide alike (REVISE or KEEP, whatever the step)."""
        return (self.both_revise + self.both_keep) / self.compared if self.compared else None

    @property
    def same_step_share(self) -> float | None:
        return self.same_step / self.both_revise if self.both_revise else None

    def as_dict(self) -> dict:
        numbers = {key: value for key, value in asdict(self).items() if key != "reviews"}
        measures = ("compared", "precision", "recall", "agreement", "same_step_share")
        return {**numbers, **{name: getattr(self, name) for name in measures}, "reviews": self.reviews}


def compare_with_reference(
    chunks: list, answers: dict[int, Verdict], reference: str, error: str | None = None
) -> Agreement:
    """Count each reviewed chunk's checked decision against the reference's verdict on the same request. `chunks`:
    judge-check's `ReviewedChunk`s (each with its `request`, the checked judge's `verdicts` and their `decision`)."""
    out = Agreement(reference, reference_error=error)
    for chunk in chunks:
        out.chunks += 1
        steps = len(chunk.request.steps)
        theirs = tally_votes([answers.get(id(chunk.request), Verdict(failed=True))], steps, 1)
        ours = chunk.decision
        out.reviews.append(
            {
                "question": chunk.request.question,
                "prefix": chunk.request.prefix,
                "steps": list(chunk.request.steps),
                "last_step_complete": chunk.request.last_step_complete,
                "checked_votes": [_decision(tally_votes([v], steps, 1)) for v in chunk.verdicts],
                "checked": _decision(ours),
                "reference": _decision(theirs),
            }
        )
        if theirs.usable == 0:
            out.reference_failed += 1
            continue
        failed = ours.usable == 0
        out.checked_failed += failed
        out.checked_failed_reference_revise += failed and theirs.wrong_step is not None
        if ours.wrong_step is not None and theirs.wrong_step is not None:
            out.both_revise += 1
            out.same_step += ours.wrong_step == theirs.wrong_step
            out.checked_earlier += ours.wrong_step < theirs.wrong_step
            out.checked_later += ours.wrong_step > theirs.wrong_step
        elif ours.wrong_step is not None:
            out.only_checked += 1
        elif theirs.wrong_step is not None:
            out.only_reference += 1
        else:
            out.both_keep += 1
    return out


def agreement_lines(agreement: Agreement) -> list[str]:
    """The report's lines on the checked judge against the reference."""
    a = agreement
    left_out = f"; {a.reference_failed} left out: the reference's answer failed" if a.reference_failed else ""
    lines = [
        f"against the reference judge {a.reference_judge}: {a.compared} reviewed chunks compared{left_out}",
        f"  REVISE precision     {_ratio(a.precision)} ({a.both_revise} of {a.both_revise + a.only_checked} chunks "
        "the judge revised, the reference revises too)",
        f"  REVISE recall        {_ratio(a.recall)} ({a.both_revise} of {a.both_revise + a.only_reference} chunks "
        "the reference revises, the judge revised too)",
        f"  first wrong step     {_ratio(a.same_step_share)} ({a.same_step} of {a.both_revise} chunks both revised, "
        f"at the same step; the judge's earlier in {a.checked_earlier}, later in {a.checked_later})",
        f"  decision agreement   {_ratio(a.agreement)} ({a.both_revise + a.both_keep} of {a.compared} chunks: both "
        "REVISE or both KEEP)",
        f"  judge failures       {a.checked_failed} of {a.compared} chunks (every review failed: KEEP, as training "
        f"takes it; the reference revises {a.checked_failed_reference_revise} of them)",
    ]
    if a.reference_error is not None:
        lines.append(f"  reference error      {a.reference_error}")
    return lines


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
