"""Judge prompt templates: math and code presets, user overrides, validation and rendering.

A template has `{field}` placeholders (the convention of `trl_mintrl.text`: other braces are text, no escaping).
Review templates may use {question}, {prefix}, {steps}, {num_steps}, {reference} and {unfinished_note}; correction
templates {question}, {prefix} and {reference}. {reference} expands to a whole "reference solution" section (ending
with a blank line) when the request has a reference and to nothing otherwise, so one template serves judges with and
without privileged context. Values are substituted verbatim: braces inside questions or solutions stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..text import check_template, fill_template, template_fields
from .base import CorrectionRequest, ReviewRequest, conversation_text

_VERDICT_INSTRUCTIONS = (
    "First explain briefly, then end your reply with exactly one final line, nothing after it:\n"
    "VERDICT: KEEP\n"
    "if every new step is correct, or\n"
    "VERDICT: REVISE <k>\n"
    "where <k> is the number of the earliest wrong step (1 to {num_steps})."
)

MATH_REVIEW_TEMPLATE = (
    "You are reviewing a student's partial solution to a math problem, one step at a time.\n\n"
    "## Problem\n{question}\n\n"
    "{reference}"
    "## Solution so far (already checked; do not review it)\n{prefix}\n\n"
    "## New steps to review\n{steps}\n\n"
    "Check the new steps in order. A step is wrong if it contains a calculation error, an invalid deduction, a "
    "misreading of the problem, or a claim that contradicts earlier correct work. Do not flag a step for style, "
    "verbosity or a different but valid approach. {unfinished_note}\n\n" + _VERDICT_INSTRUCTIONS
)

CODE_REVIEW_TEMPLATE = (
    "You are reviewing a student's partial solution to a programming problem, one step at a time.\n\n"
    "## Problem\n{question}\n\n"
    "{reference}"
    "## Solution so far (already checked; do not review it)\n{prefix}\n\n"
    "## New steps to review\n{steps}\n\n"
    "The new text is split into steps at line breaks or blank lines in prose, and at code-fence lines (```) and blank "
    "lines in code: a code block can span several steps (its opening fence line starts a step, its closing fence "
    "line ends one), and a step can continue a code block opened earlier. Read the code across steps as one program, "
    "but judge each step by its own lines.\n\n"
    "Check the new steps in order. A step is wrong if it misreads the problem or the input/output format, has a "
    "logic or off-by-one error, mishandles an edge case, is too slow for the constraints, or does not run. Do not "
    "flag a step for style, naming or a different but valid approach. {unfinished_note}\n\n" + _VERDICT_INSTRUCTIONS
)

# Corrections must read as the student's own next step: the policy learns from them (judge tokens are in its loss), and
# on the toy benchmark a correction in the reference's notation (`7#5=14` where the policy writes `7+5=`) was absorbed
# slowly and garbled the policy's own steps, while the same correction in the policy's notation was absorbed within a
# few steps (docs/judges.md).
STUDENT_NOTATION = (
    "Write it as the student would: keep the student's own notation and style (the symbols, variable names and step "
    "format of the partial solution), not the reference solution's, even where the reference writes this step "
    "differently."
)

MATH_CORRECTION_TEMPLATE = (
    "A student is solving a math problem. Their partial solution below is correct so far, but the step they wrote "
    "next was wrong and has been removed.\n\n"
    "## Problem\n{question}\n\n"
    "{reference}"
    "## Partial solution\n{prefix}\n\n"
    "Write only the next short correct piece of the solution, continuing exactly where the partial solution stops: "
    "at most two or three sentences or one short calculation. " + STUDENT_NOTATION + " Do not restate the partial "
    "solution, do not solve the rest of the problem, and write no heading or label: your text is appended to the "
    "solution as is."
)

CODE_CORRECTION_TEMPLATE = (
    "A student is solving a programming problem. Their partial solution below is correct so far, but the step they "
    "wrote next was wrong and has been removed.\n\n"
    "## Problem\n{question}\n\n"
    "{reference}"
    "## Partial solution\n{prefix}\n\n"
    "Write only the next short correct piece, continuing exactly where the partial solution stops: a few lines of "
    "code or at most two or three sentences. " + STUDENT_NOTATION + " Do not restate the partial solution, do not "
    "write the whole program, and write no heading or label: your text is appended to the solution as is."
)

REVIEW_TEMPLATES = {"math": MATH_REVIEW_TEMPLATE, "code": CODE_REVIEW_TEMPLATE}
CORRECTION_TEMPLATES = {"math": MATH_CORRECTION_TEMPLATE, "code": CODE_CORRECTION_TEMPLATE}

REVIEW_FIELDS = frozenset({"question", "prefix", "steps", "num_steps", "reference", "unfinished_note"})
CORRECTION_FIELDS = frozenset({"question", "prefix", "reference"})

_EMPTY_PREFIX = "(nothing yet: the new steps start the solution)"


def resolve_template(value: str, kind: str, option: str | None = None) -> str:
    """Return the template for a preset name ("math", "code") or validate a custom template string.

    Args:
        value: a preset name or a custom template string.
        kind: "review" or "correction".
        option: the config field named in error messages (default `judge_<kind>_template`).
    """
    if kind not in ("review", "correction"):
        raise ValueError(f"kind must be 'review' or 'correction', got {kind!r}")
    presets, allowed = (
        (REVIEW_TEMPLATES, REVIEW_FIELDS) if kind == "review" else (CORRECTION_TEMPLATES, CORRECTION_FIELDS)
    )
    option = option or f"judge_{kind}_template"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"`{option}` must be a preset name ({', '.join(presets)}) or a template string, got {value!r}"
        )
    if value in presets:
        return presets[value]
    if not template_fields(value):  # most likely a misspelt preset name
        raise ValueError(
            f"`{option}`={value!r} is neither a preset ({', '.join(presets)}) nor a template with fields."
        )
    # without {steps} (review) or {prefix} (correction) the judge cannot see the text
    check_template(option, value, allowed, required={"steps" if kind == "review" else "prefix"})
    return value


def _block(text: str) -> str:
    """Text without surrounding blank lines and trailing spaces; the first line keeps its indentation (code)."""
    return text.strip("\r\n").rstrip()


def _reference_section(reference: str | None) -> str:
    if not reference or not reference.strip():
        return ""
    return f"## Reference solution (for you only; the student cannot see it)\n{_block(reference)}\n\n"


def format_steps(steps: list[str]) -> str:
    """Number the steps 1..n, each under its own header (1-based, as the verdict line refers to them)."""
    return "\n\n".join(f"### Step {i}\n{_block(step)}" for i, step in enumerate(steps, start=1))


@dataclass(frozen=True)
class JudgeTemplates:
    """A review/correction template pair (preset names or custom strings, resolved and validated on construction)
    that renders requests into prompt texts."""

    review: str = "math"
    correction: str = "math"

    def __post_init__(self):
        object.__setattr__(self, "review", resolve_template(self.review, "review"))
        object.__setattr__(self, "correction", resolve_template(self.correction, "correction"))

    def render_review(self, request: ReviewRequest) -> str:
        n = len(request.steps)
        unfinished_note = (
            ""
            if request.last_step_complete
            else f"Step {n} was cut off by the length limit and may be unfinished: judge only what it says so far "
            "and do not flag it for being incomplete."
        )
        return fill_template(
            self.review,
            {
                "question": request.question.strip(),
                "prefix": _block(conversation_text(request.conversation, request.prefix)) or _EMPTY_PREFIX,
                "steps": format_steps(request.steps),
                "num_steps": n,
                "reference": _reference_section(request.reference),
                "unfinished_note": unfinished_note,
            },
        )

    def render_correction(self, request: CorrectionRequest) -> str:
        return fill_template(
            self.correction,
            {
                "question": request.question.strip(),
                "prefix": _block(conversation_text(request.conversation, request.prefix))
                or "(empty: write the first step)",
                "reference": _reference_section(request.reference),
            },
        )
