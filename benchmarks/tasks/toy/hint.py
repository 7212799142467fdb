"""SORT's regime: a warm start that uses a rule stated in its prompt, and a planner that states it.

SORT's weights `sqrt(p_base * p_plan)` can only make a reference token salient when the plan makes it likely, so
the regime needs a policy that reads a hint in its context. The hint warm start (`WARM_START_HINT_DIR`, built by
`python -m benchmarks.tasks.toy.warm_start_build --hint`) is the committed warm start trained further on a mix of its own
problems and hinted ones: `Rule: a%b = a+b-3. Compute 4-1%5 =` whose last step applies the rule, written the
policy's way (`3+5=5`: the `+` of the near notation, the rule's value). Hinted training uses the symbols of
`HINT_SYMBOLS` and offsets `HINT_OFFSETS`, never `@`: the regime's `a@b = a+b-7` is never seen, with or without a
hint. The rule planner (`rule_planner`) writes `Rule: a@b = a+b-7.` from the question and the reference (the
offset read from the reference's step), and the regime's teacher prompt (`HINT_TEACHER_TEMPLATE`) is the hinted
prompt the warm start was trained on.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from .task import OFFSETS, STEP_SEPARATOR, make_problem, parse_question

WARM_START_HINT_DIR = Path(__file__).parent / "warm_start_hint"
HINT_SYMBOLS = "%&$~^"  # operators of the hinted training prompts (not `@` or `#`, the regimes' operators)
HINT_OFFSETS = tuple(k for k in range(-9, 10) if k != 0)  # k of `a op b = a+b+k` in hinted training
HINT_TEACHER_TEMPLATE = "{plan} {question}"  # SORT's teacher prompt: the hinted prompt of training
HINT_MIN_OPS, HINT_MAX_OPS = 1, 6
_STEP = re.compile(r"(\d+)\s*\S\s*(\d+)\s*=\s*(\d+)")


def rule_text(symbol: str, offset: int) -> str:
    """The hint, in the one wording of training and of the planner: `Rule: a@b = a+b-7.`"""
    return f"Rule: a{symbol}b = a+b{offset:+d}."


def hint_prompt(hint: str, question: str) -> str:
    """The hinted user message: the rule, then the question (`HINT_TEACHER_TEMPLATE` rendered)."""
    return HINT_TEACHER_TEMPLATE.format(plan=hint, question=question)


def plan_rule(question: str, reference: str) -> str:
    """The rule planner's `plan_fn`: the rule of the question's new operator (its last operation), the offset read
    from the reference's step for it (`12+3=8` or `12@3=8`: k = 8 - 12 - 3). Raises on a question without a new
    operator or a reference without that step (`FunctionPlanner` marks the item failed)."""
    problem = parse_question(question)
    op, _ = problem.ops[-1]
    if op not in OFFSETS:
        raise ValueError(f"no new operator in {question!r}")
    steps = [s for s in reference.split("Answer:")[0].split(STEP_SEPARATOR) if s.strip()]
    if len(steps) < problem.num_ops or (match := _STEP.fullmatch(steps[problem.num_ops - 1].strip())) is None:
        raise ValueError(f"reference has no step for the new operator: {reference!r}")
    a, b, value = map(int, match.groups())
    return rule_text(op, value - a - b)


def rule_planner():
    """A `FunctionPlanner` writing `plan_rule`'s hint: the toy's programmatic planner for SORT."""
    from trl_mintrl.sort import FunctionPlanner

    return FunctionPlanner(plan_rule)


@dataclass(frozen=True)
class HintedExample:
    """A hinted training example: `row()["prompt"]` and `solution`, as `warm_start.sft_batch` reads a `Problem`."""

    content: str
    solution: str

    def row(self) -> dict:
        return {"prompt": [{"role": "user", "content": self.content}], "solution": self.solution}


def make_hinted_example(rng: random.Random, num_ops: int, max_value: int = 19) -> HintedExample:
    """A chain of `num_ops` operations whose last is `a s b = a+b+k` for a random symbol of `HINT_SYMBOLS` and k of
    `HINT_OFFSETS`, stated in the prompt; operand and values drawn as for the regimes' new operators (the step
    stays in 0..max_value and a+b <= max_value); the rule's step written as `a+b=v`."""
    symbol, k = rng.choice(HINT_SYMBOLS), rng.choice(HINT_OFFSETS)
    while True:
        prefix = make_problem(rng, num_ops - 1) if num_ops > 1 else None
        value = prefix.answer if prefix else rng.randint(0, 9)
        low, high = max(0, -k - value), min(9, 9 - k, max_value - value - k, max_value - value)
        if low <= high:
            break
    b = rng.randint(low, high)
    first = prefix.first if prefix else value
    ops = "".join(f"{op}{x}" for op, x in prefix.ops) if prefix else ""
    question = f"Compute {first}{ops}{symbol}{b} ="
    steps = [*(prefix.steps[:-1] if prefix else []), f"{value}+{b}={value + b + k}", f"Answer: {value + b + k}"]
    return HintedExample(hint_prompt(rule_text(symbol, k), question), STEP_SEPARATOR.join(steps))


def hinted_prompt_fn(planner_fn=plan_rule, notation: str = "near"):
    """`Problem -> prompt` with the planner's hint before the question (the regime's problems, calibration (b))."""

    def prompt(problem) -> list[dict]:
        reference = STEP_SEPARATOR.join(problem.written_steps(notation))
        return [{"role": "user", "content": hint_prompt(planner_fn(problem.question, reference), problem.question)}]

    return prompt
