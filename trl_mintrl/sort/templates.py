"""SORT's prompt templates and the placeholders each must contain.

Templates have `{field}` placeholders (the convention of `trl_mintrl.text`: other braces, such as `\\boxed{}`, are
text). They are rendered with the question (`text.question_text`), the reference solution or the plan, then
tokenised through the chat template for conversational datasets (one user message) or plainly for plain-text ones,
the way the dataset's own prompts are.
"""

from __future__ import annotations

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
