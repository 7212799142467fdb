"""SORT's prompt templates and their validation.

Templates are `str.format` strings. They are rendered with the question (`prompts.question_text`), the reference
solution or the plan, then tokenised through the chat template for conversational datasets (one user message) or
plainly for plain-text ones, the way the dataset's own prompts are.
"""

from __future__ import annotations

import re
import string

# PlanExtract(y*): the current policy summarises the reference into the decisions that matter.
PLAN_TEMPLATE = (
    "Here is a problem and a correct reference solution.\n\n"
    "Problem:\n{question}\n\n"
    "Reference solution:\n{reference}\n\n"
    "Extract a compact plan of this solution: the key substitutions, case splits, lemmas and checks it relies on, "
    "as a short numbered list. Do not redo the computations."
)

# TeacherPrompt(q, plan): the same question with the plan as diagnostic context.
TEACHER_TEMPLATE = (
    "{question}\n\n"
    "A plan for the solution (key substitutions, case splits, lemmas, checks):\n{plan}\n\n"
    "Solve the problem following this plan."
)

# Placeholders each template field must contain.
REQUIRED_FIELDS = {
    "plan_template": {"question", "reference"},
    "teacher_template": {"question", "plan"},
    "base_template": {"question"},
}


def check_template(name: str, template: str) -> None:
    """Raise a `ValueError` naming the config field when a template is malformed or lacks a placeholder."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as err:
        raise ValueError(
            f"`{name}` is not a valid str.format template ({err}); write literal braces as '{{{{' and '}}}}'."
        ) from err
    allowed = REQUIRED_FIELDS[name]
    missing, unknown = allowed - fields, fields - allowed
    if missing or unknown:
        raise ValueError(
            f"`{name}` must use exactly the placeholders {sorted('{' + f + '}' for f in allowed)}; "
            f"missing {sorted(missing)}, unknown {sorted(unknown)}. Write literal braces as '{{{{' and '}}}}'."
        )


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_CLOSED_THINK_BLOCK = re.compile(re.escape(THINK_OPEN) + ".*?" + re.escape(THINK_CLOSE), re.DOTALL)


def plan_outside_thinking(prompt_text: str, generated: str) -> tuple[str, bool]:
    """(the plan: the generated text outside thinking blocks, stripped; whether a thinking block was left open).

    A block may open in the prompt (templates that start the assistant turn with `<think>`) or in the generation.
    An unclosed block is cut with everything after its opening tag: that text is reasoning, not a plan.
    """
    if prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE):
        generated = THINK_OPEN + generated
    text = _CLOSED_THINK_BLOCK.sub("", generated)
    start = text.find(THINK_OPEN)
    if start >= 0:
        return text[:start].strip(), True
    return text.strip(), False
