"""Reference solutions written at increasing distance from the student.

The same correct steps, written the way a teacher other than the student might: the distance is measured, not
assumed, as the references' mean NLL per token under the warm start (`benchmarks/studies/references.py`). Every style is a
solution the reward accepts (`Problem.solved`: the right answer, every rule step with its right value) and fits the
in-band regime's completion budget, so a student that learns to write it is not cut off by `max_completion_length`:
what changes is only how far the text is from what the student writes.

- "own": the in-band regime's references, in the student's notation (`12+3=14` for the rule step `12~3`).
- "symbol": the rule's step written with its own operator (`12~3=14`), a token the student never wrote.
- "spaced": a teacher's formatting: `12 ~ 3 = 14`, one step per line (the student writes no spaces and separates
  steps by a blank line).
- "worded": a word of prose before each step (`first ...`, `then 12~3=14`, `last ...`), steps separated by a
  blank line.

A different order of the steps is not among them: the chain is evaluated left to right and the reward checks each
rule step's running value, so reordered steps are not a valid solution here.
"""

from __future__ import annotations

from .task import STEP_SEPARATOR, Problem

STYLES = ("own", "symbol", "spaced", "worded")


def write_reference(problem: Problem, style: str) -> str:
    """`problem`'s reference solution in `style` (one of `STYLES`)."""
    if style == "own":
        return STEP_SEPARATOR.join(problem.written_steps("near"))
    *steps, answer = problem.written_steps("far")
    if style == "symbol":
        return STEP_SEPARATOR.join([*steps, answer])
    if style == "spaced":
        spaced = [step.replace("=", " = ").replace(op, f" {op} ", 1) for step, (op, _) in zip(steps, problem.ops)]
        return "\n".join([*spaced, answer])
    if style == "worded":
        words = ["first"] + ["then"] * (len(steps) - 2) + ["last"]
        return STEP_SEPARATOR.join([*(f"{word} {step}" for word, step in zip(words, steps)), answer])
    raise ValueError(f"unknown reference style {style!r}; expected one of {STYLES}")
