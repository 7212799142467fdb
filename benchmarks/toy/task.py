"""Synthetic multi-step arithmetic: problems, reference solutions, the reward and a rule-based judge.

`Compute 7-7+9-8 =` is solved one operation per step, steps separated by blank lines, then the answer:
`7-7=0\n\n0+9=9\n\n9-8=1\n\nAnswer: 1`. Difficulty is the number of operations. Every running value stays in
`[0, max_value]`, so the steps are small additions and subtractions and the hard part is carrying a long chain
without a slip, which is where a weak policy's whole group goes wrong and a step-level judge can help.

The support-expansion variant (`new_op=True`) ends every chain with an operator the warm start never saw,
`a#b = a+b+2`, whose rule no prompt states: `Compute 4-3#2 =` is `4-3=1\n\n1#2=5\n\nAnswer: 5`. Only the judge's
corrections and the reference solutions know it, so a policy sampling on its own (GRPO) almost never finds it. It is
the last operation so that no later step can land on the right answer by accident (a wrong value clamped at 0). `Problem.familiar()` is the same
problem with `a#b` written as `a+(b+2)`: same steps and values, nothing new to know.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

STEP_SEPARATOR = "\n\n"
NEW_OPERATOR = "#"
_QUESTION = re.compile(r"Compute\s+(\d+(?:\s*[-+#]\s*\d+)+)\s*=")
_TERM = re.compile(r"([-+#]?)\s*(\d+)")


def apply_op(value: int, op: str, b: int) -> int:
    """`value op b` for `+`, `-` and the new operator `a#b = a+b+2`."""
    if op == "+":
        return value + b
    if op == "-":
        return value - b
    if op == NEW_OPERATOR:
        return value + b + 2
    raise ValueError(f"unknown operator {op!r}")


_ANSWER = re.compile(r"Answer:\s*(-?\d+)(?!\d)")


@dataclass(frozen=True)
class Problem:
    """`first` followed by `(op, operand)` pairs, evaluated left to right."""

    first: int
    ops: tuple[tuple[str, int], ...]

    @property
    def question(self) -> str:
        return "Compute " + str(self.first) + "".join(f"{op}{b}" for op, b in self.ops) + " ="

    @property
    def steps(self) -> list[str]:
        """The reference steps, the final `Answer: n` line included (no separators)."""
        steps, value = [], self.first
        for op, b in self.ops:
            new = apply_op(value, op, b)
            steps.append(f"{value}{op}{b}={new}")
            value = new
        return [*steps, f"Answer: {value}"]

    @property
    def answer(self) -> int:
        value = self.first
        for op, b in self.ops:
            value = apply_op(value, op, b)
        return value

    @property
    def solution(self) -> str:
        return STEP_SEPARATOR.join(self.steps)

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    def familiar(self) -> Problem:
        """The same problem without the new operator: `a#b` becomes `a+(b+2)` (same running values)."""
        return Problem(self.first, tuple(("+", b + 2) if op == NEW_OPERATOR else (op, b) for op, b in self.ops))

    def row(self) -> dict:
        """A dataset row: conversational prompt, reference solution (for SORT and judges) and the answer."""
        return {
            "prompt": [{"role": "user", "content": self.question}],
            "solution": self.solution,
            "answer": self.answer,
            "num_ops": self.num_ops,
        }


def parse_question(question: str) -> Problem:
    """The problem a `Compute ... =` question asks (the question may sit inside a longer prompt)."""
    match = _QUESTION.search(question)
    if match is None:
        raise ValueError(f"not a toy arithmetic question: {question!r}")
    terms = _TERM.findall(match.group(1))
    first = int(terms[0][1])
    return Problem(first, tuple((op, int(b)) for op, b in terms[1:]))


def make_problem(
    rng: random.Random, num_ops: int, max_operand: int = 9, max_value: int = 19, new_op: bool = False
) -> Problem:
    """A random problem with `num_ops` operations whose running value stays in `[0, max_value]`. With `new_op` the
    last operation is the new operator `#`, its operand at most `max_operand - 2` so that `familiar()` stays within
    the familiar operands (without it, the problems drawn are exactly the ones drawn before `#` existed)."""
    value = rng.randint(0, max_operand)
    first, ops = value, []
    for i in range(num_ops):
        if new_op and i == num_ops - 1:
            if value > max_value - 2:  # no room for a#b >= a+2: draw the problem again
                return make_problem(rng, num_ops, max_operand, max_value, new_op)
            b = rng.randint(0, min(max_operand - 2, max_value - value - 2))
            ops.append((NEW_OPERATOR, b))
            break
        choices = []
        while not choices:  # terminates: b = 0 is always legal
            b = rng.randint(0, max_operand)
            choices = [op for op, ok in (("+", value + b <= max_value), ("-", value - b >= 0)) if ok]
        op = rng.choice(choices)
        value = value + b if op == "+" else value - b
        ops.append((op, b))
    return Problem(first, tuple(ops))


def make_problems(
    n: int, min_ops: int, max_ops: int, seed: int, max_operand: int = 9, max_value: int = 19, new_op: bool = False
) -> list[Problem]:
    """`n` problems with `min_ops..max_ops` operations (uniform), ending in `#` with `new_op`; deterministic."""
    rng = random.Random(seed)
    return [make_problem(rng, rng.randint(min_ops, max_ops), max_operand, max_value, new_op) for _ in range(n)]


def make_dataset(n: int, min_ops: int, max_ops: int, seed: int, **kwargs):
    """A `datasets.Dataset` of `make_problems(...)` rows (`prompt`, `solution`, `answer`, `num_ops`)."""
    from datasets import Dataset

    return Dataset.from_list([p.row() for p in make_problems(n, min_ops, max_ops, seed, **kwargs)])


def final_answer(text: str) -> int | None:
    """The number on the first `Answer:` line, or None when there is none."""
    match = _ANSWER.search(text)
    return int(match.group(1)) if match else None


def toy_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's first `Answer:` is the right number, else 0.0 (plain or conversational)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(final_answer(t) == int(a)) for t, a in zip(texts, answer, strict=True)]


def _split(text: str) -> list[tuple[int, str, bool]]:
    """(start offset, stripped text, closed by a blank line) of each step of `text`."""
    from trl_mintrl.mintrl.steps import split_steps

    out, offset = [], 0
    for step in split_steps(text):
        if step.strip():
            out.append((offset, step.strip(), step.rstrip(" \t").endswith(STEP_SEPARATOR)))
        offset += len(step)
    return out


def review_steps(question: str, prefix: str, steps: list[str], reference: str | None = None) -> int | None:
    """Rule review: index in `steps` of the step holding the earliest wrong step of `prefix + steps`, else None.

    A step is right when it equals the reference step. An unfinished last step (the chunk was cut mid-step) is right
    while it is a prefix of the reference step. A step that straddles the prefix/chunk boundary maps to index 0.
    """
    expected = parse_question(question).steps
    chunk = "".join(steps)
    text = prefix + chunk
    parsed = _split(text)
    for j, (start, step, closed) in enumerate(parsed):
        is_last = j == len(parsed) - 1
        if j < len(expected) and (step == expected[j] or (is_last and not closed and expected[j].startswith(step))):
            continue
        offset = start - len(prefix)
        if offset < 0:
            return 0
        index, end = 0, 0
        for i, s in enumerate(steps):
            end += len(s)
            if offset < end:
                index = i
                break
        return index
    return None


def review_from_start(question: str, prefix: str, steps: list[str], reference: str | None = None) -> int | None:
    """`review_steps`, except that the first chunk of a rollout (nothing accepted yet) is always revised at step 0."""
    if not prefix.strip() and any(step.strip() for step in steps):
        return 0
    return review_steps(question, prefix, steps, reference)


def correct_step(question: str, prefix: str, reference: str | None = None, steps: int = 1) -> str:
    """Rule correction: the rest of the current step, or the next reference step, with its separator; `steps` > 1
    writes that many reference steps (a more verbose judge: the knob for judge-token share in the benchmarks)."""
    expected = parse_question(question).steps
    parsed = _split(prefix)
    done = sum(closed for _, _, closed in parsed)
    if done >= len(expected):
        return ""
    end = min(done + steps, len(expected))
    target = STEP_SEPARATOR.join(expected[done:end]) + (STEP_SEPARATOR if end < len(expected) else "")
    partial = prefix[parsed[-1][0] :].lstrip() if parsed and not parsed[-1][2] else ""
    if partial and target.startswith(partial):
        return target[len(partial) :]
    return (STEP_SEPARATOR if partial else "") + target


def rule_judge(steps_per_correction: int = 1, error_rate: float = 0.0, seed: int = 0, from_start: bool = False):
    """A `FunctionJudge` that checks every step exactly and writes the correct step, or the next
    `steps_per_correction` steps (a strong, cheap judge). `from_start` revises every rollout at its first step (with
    `steps_per_correction` >= the chain length the judge writes the whole solution: the sweep's off-policy extreme). With `error_rate` p > 0 it errs like a real judge: a chunk
    the rule finds right is flagged at a random step with probability p, and a correction carries a wrong number with
    probability p (independent draws from `seed`, so `judge_votes` reviews of one chunk can disagree)."""
    from trl_mintrl.judges.function import FunctionJudge

    if steps_per_correction < 1:
        raise ValueError(f"steps_per_correction must be >= 1, got {steps_per_correction}")
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
    correct = (
        correct_step if steps_per_correction == 1 else functools.partial(correct_step, steps=steps_per_correction)
    )
    review = review_from_start if from_start else review_steps
    if error_rate == 0.0:
        return FunctionJudge(review, correct)
    rng = random.Random(seed)

    def noisy_review(question, prefix, steps, reference=None):
        index = review(question, prefix, steps, reference)
        if index is None and rng.random() < error_rate:
            candidates = [i for i, step in enumerate(steps) if step.strip()]
            return rng.choice(candidates) if candidates else None
        return index

    def noisy_correct(question, prefix, reference=None):
        text = correct(question, prefix, reference)
        return corrupt_number(text, rng) if rng.random() < error_rate else text

    return FunctionJudge(noisy_review, noisy_correct)


def corrupt_number(text: str, rng: random.Random) -> str:
    """`text` with its first result (the number after `=`, else its last number) off by 1 or 2, never negative."""
    results = list(re.finditer(r"=(\d+)", text))
    numbers = list(re.finditer(r"(\d+)", text))
    match = results[0] if results else (numbers[-1] if numbers else None)
    if match is None:
        return text
    value = int(match.group(1))
    wrong = value + rng.choice([d for d in (-2, -1, 1, 2) if value + d >= 0])
    return text[: match.start(1)] + str(wrong) + text[match.end(1) :]
