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

The out-of-reach variant (`new_op="@"`) uses `a@b = a+b-7` instead (operand 0-9, `a+b` in 7-19, so that reading `@`
as `+` stays in the familiar range), drawn so that its final answers are uniform over 0-12 (a constant guess scores
on about 1/13 of problems), and it is scored
by `step_reward`: the answer counts only when the `@` step is written with the right value too (`a@b=v`, or the
policy's own `a+b=v`), so a guessed or slipped-into final answer earns nothing. The warm start reads an unseen
operator as `+` (or `-`) and its slips there are mostly a few units off: `+2` is a systematic near miss (about 2% of
samples), `-7` on the step itself is not (`benchmarks.tasks.toy.calibration` measures both).

Notation: the reference writes the new operator's step as `1#2=5` ("far" from the policy, which never produced `#`);
the "near" notation writes it the way the policy writes that step, `1+2=5`: same value, the policy's own tokens.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

STEP_SEPARATOR = "\n\n"
NEW_OPERATOR = "#"  # the unreachable regime's operator
FAR_OPERATOR = "@"  # the out-of-reach regime's operator
# The in-band regime's rules: `a op b = a+b+k` applied at several steps of a chain, each a correction the
# warm start finds unlikely but not impossible; one symbol per offset k so that the distance sweep's regimes differ
# only in k (k = 0, `a?b = a+b`, is the near end: the warm start's own reading of an unseen operator). `~` (k = -1) is
# the in-band regime's rule.
BAND_OPERATORS = {"~": -1, "?": 0, "^": 1, "&": -2, "$": 2, "%": -3, "!": -7}
OFFSETS = {NEW_OPERATOR: 2, FAR_OPERATOR: -7, **BAND_OPERATORS}  # new operator -> k in `a op b = a+b+k`
# operators whose problems are drawn with a uniform final answer over 0..max_value (a constant guess scores ~1/20)
UNIFORM_ANSWERS = {FAR_OPERATOR}
# operators whose every step `step_reward` checks as well as the answer
STEP_CHECKED = {FAR_OPERATOR, *BAND_OPERATORS}
NOTATIONS = ("far", "near")
_OPS = "-+" + "".join(OFFSETS)
_QUESTION = re.compile(rf"Compute\s+(\d+(?:\s*[{_OPS}]\s*\d+)+)\s*=")
_TERM = re.compile(rf"([{_OPS}]?)\s*(\d+)")


def apply_op(value: int, op: str, b: int) -> int:
    """`value op b` for `+`, `-` and the new operators `a op b = a+b+OFFSETS[op]`."""
    if op == "+":
        return value + b
    if op == "-":
        return value - b
    if op in OFFSETS:
        return value + b + OFFSETS[op]
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
        return self.written_steps("far")

    def written_steps(self, notation: str) -> list[str]:
        """The steps in `notation`: "far" (the reference: `1#2=5`) or "near" (a new operator's step written the way
        the policy writes it, with `+`: `1+2=5`; same values)."""
        if notation not in NOTATIONS:
            raise ValueError(f"unknown notation {notation!r}; expected one of {NOTATIONS}")
        steps, value = [], self.first
        for op, b in self.ops:
            new = apply_op(value, op, b)
            shown = "+" if notation == "near" and op in OFFSETS else op
            steps.append(f"{value}{shown}{b}={new}")
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
        """The same problem without the new operator: `a#b` becomes `a+(b+2)`, `a@b` `a-(7-b)` (or `a+(b-7)` for
        b >= 7; same running values)."""
        ops = []
        for op, b in self.ops:
            c = b + OFFSETS[op] if op in OFFSETS else None
            ops.append((op, b) if c is None else ("+", c) if c >= 0 else ("-", -c))
        return Problem(self.first, tuple(ops))

    def new_step_right(self, text: str) -> bool:
        """Whether `text` writes every step of a `STEP_CHECKED` operator with the right operands and value, in the
        reference's notation (`12@3=8`) or the policy's (`12+3=8`), before its answer; True without such a step."""
        body, value = text.split("Answer:")[0], self.first
        for op, b in self.ops:
            new = apply_op(value, op, b)
            step = rf"(?<!\d){value}\s*[{re.escape(op)}+]\s*{b}\s*=\s*{new}(?!\d)"
            if op in STEP_CHECKED and re.search(step, body) is None:
                return False
            value = new
        return True

    def solved(self, text: str) -> bool:
        """The benchmark's success: the right final answer and, for a `STEP_CHECKED` operator, its step written
        right (`toy_reward` on every other problem)."""
        return final_answer(text) == self.answer and self.new_step_right(text)

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
    rng: random.Random,
    num_ops: int,
    max_operand: int = 9,
    max_value: int = 19,
    new_op: bool | str = False,
    new_op_count: int = 1,
) -> Problem:
    """A random problem with `num_ops` operations whose running value stays in `[0, max_value]`. With `new_op` (an
    operator of `OFFSETS`; True: `#`) the last operation is that new operator, and so are `new_op_count - 1` earlier
    ones drawn at random (the in-band regime applies its rule more than once), each operand chosen so that
    `familiar()` stays within the familiar operands (without it, the problems drawn are exactly the ones drawn before
    the new operators existed). For an operator in `UNIFORM_ANSWERS` the final answer is first drawn uniformly from
    the values it can take (`@`: 0..max_value-7) and problems are drawn until one has it."""
    op_new = NEW_OPERATOR if new_op is True else new_op
    if not 1 <= new_op_count <= max(num_ops, 1):
        raise ValueError(f"new_op_count must be in 1..num_ops ({num_ops}), got {new_op_count}")
    if op_new not in UNIFORM_ANSWERS:
        return _draw_problem(rng, num_ops, max_operand, max_value, op_new, new_op_count)
    k = OFFSETS[op_new]
    target = rng.randint(max(0, k), max_value + min(0, k))  # every value the operator can produce
    while (problem := _draw_problem(rng, num_ops, max_operand, max_value, op_new, new_op_count)).answer != target:
        pass
    return problem


def _draw_problem(
    rng: random.Random, num_ops: int, max_operand: int, max_value: int, op_new, new_op_count: int = 1
) -> Problem:
    # the new operator's positions: the last, and (count > 1 only, so that single-rule problems draw as before)
    # `new_op_count - 1` of the others
    at = {num_ops - 1} | (set(rng.sample(range(num_ops - 1), new_op_count - 1)) if new_op_count > 1 else set())
    value = rng.randint(0, max_operand)
    first, ops = value, []
    for i in range(num_ops):
        if op_new and i in at:
            k = OFFSETS[op_new]
            low = max(0, -k - value)  # a op b >= 0
            # familiar operand; a op b <= max; a+b <= max (read as `+`, the step stays in the familiar range: above
            # it the warm start's values wrap near the top and land on the rule by accident)
            high = min(max_operand, max_operand - k, max_value - value - k, max_value - value)
            if low > high:  # no legal operand: draw the problem again
                return _draw_problem(rng, num_ops, max_operand, max_value, op_new, new_op_count)
            b = rng.randint(low, high)
            ops.append((op_new, b))
            value = apply_op(value, op_new, b)
            continue
        choices = []
        while not choices:  # terminates: b = 0 is always legal
            b = rng.randint(0, max_operand)
            choices = [op for op, ok in (("+", value + b <= max_value), ("-", value - b >= 0)) if ok]
        op = rng.choice(choices)
        value = value + b if op == "+" else value - b
        ops.append((op, b))
    return Problem(first, tuple(ops))


def make_problems(
    n: int,
    min_ops: int,
    max_ops: int,
    seed: int,
    max_operand: int = 9,
    max_value: int = 19,
    new_op: bool | str = False,
    new_op_count: int = 1,
) -> list[Problem]:
    """`n` problems with `min_ops..max_ops` operations (uniform), ending in a new operator with `new_op` (used
    `new_op_count` times); deterministic."""
    rng = random.Random(seed)
    return [
        make_problem(rng, rng.randint(min_ops, max_ops), max_operand, max_value, new_op, new_op_count)
        for _ in range(n)
    ]


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


def step_reward(completions, answer, prompts, **kwargs) -> list[float]:
    """The out-of-reach regime's reward: 1.0 when `Problem.solved` (the right answer and, for a `STEP_CHECKED`
    operator, its step written with the right value), else 0.0; the problem is read from the prompt."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    questions = [" ".join(m["content"] for m in p) if isinstance(p, list) else p for p in prompts]
    return [
        float(problem.answer == int(a) and problem.solved(t))
        for t, a, problem in zip(texts, answer, map(parse_question, questions), strict=True)
    ]


def _split(text: str) -> list[tuple[int, str, bool]]:
    """(start offset, stripped text, closed by a blank line) of each step of `text`."""
    from trl_mintrl.mintrl import split_steps

    out, offset = [], 0
    for step in split_steps(text):
        if step.strip():
            out.append((offset, step.strip(), step.rstrip(" \t").endswith(STEP_SEPARATOR)))
        offset += len(step)
    return out


def review_steps(
    question: str, prefix: str, steps: list[str], reference: str | None = None, notation: str = "far"
) -> int | None:
    """Rule review: index in `steps` of the step holding the earliest wrong step of `prefix + steps`, else None.

    A step is right when it equals the reference step; with `notation="near"` also when it is written the policy's
    way (`1+2=5` for `1#2=5`: right iff the value is). An unfinished last step (the chunk was cut mid-step) is right
    while it is a prefix of a right step. A step that straddles the prefix/chunk boundary maps to index 0.
    """
    problem = parse_question(question)
    forms = {"far": ["far"], "near": ["far", "near"]}[notation]
    right = list(zip(*(problem.written_steps(n) for n in forms), strict=True))
    chunk = "".join(steps)
    text = prefix + chunk
    parsed = _split(text)
    for j, (start, step, closed) in enumerate(parsed):
        is_last = j == len(parsed) - 1
        if j < len(right) and any(
            step == form or (is_last and not closed and form.startswith(step)) for form in right[j]
        ):
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


def review_from_start(
    question: str, prefix: str, steps: list[str], reference: str | None = None, notation: str = "far"
) -> int | None:
    """`review_steps`, except that the first chunk of a rollout (nothing accepted yet) is always revised at step 0."""
    if not prefix.strip() and any(step.strip() for step in steps):
        return 0
    return review_steps(question, prefix, steps, reference, notation)


def correct_step(
    question: str, prefix: str, reference: str | None = None, steps: int = 1, notation: str = "far"
) -> str:
    """Rule correction: the rest of the current step, or the next reference step, with its separator; `steps` > 1
    writes that many reference steps (a more verbose judge: the knob for judge-token share in the benchmarks).
    Steps are written in `notation` ("near": a new operator's step as `1+2=5`); an unfinished step is completed in
    whichever notation it was begun."""
    problem = parse_question(question)
    parsed = _split(prefix)
    done = sum(closed for _, _, closed in parsed)
    if done >= len(problem.steps):
        return ""
    end = min(done + steps, len(problem.steps))
    targets = [
        STEP_SEPARATOR.join(problem.written_steps(n)[done:end]) + (STEP_SEPARATOR if end < len(problem.steps) else "")
        for n in dict.fromkeys([notation, "far"])
    ]
    partial = prefix[parsed[-1][0] :].lstrip() if parsed and not parsed[-1][2] else ""
    for target in targets:
        if partial and target.startswith(partial):
            return target[len(partial) :]
    return (STEP_SEPARATOR if partial else "") + targets[0]


JUDGE_ERRORS = ("false_revise", "missed_error", "wrong_correction")  # `rule_judge`'s kinds of error


def rule_judge(
    steps_per_correction: int = 1,
    false_revise: float = 0.0,
    missed_error: float = 0.0,
    wrong_correction: float = 0.0,
    seed: int = 0,
    from_start: bool = False,
    notation: str = "far",
):
    """A `FunctionJudge` that checks every step exactly and writes the correct step, or the next
    `steps_per_correction` steps (a strong, cheap judge). `from_start` revises every rollout at its first step (with
    `steps_per_correction` >= the chain length the judge writes the whole solution: the sweep's off-policy extreme).
    `notation`: "far" writes and accepts only the reference's notation (`1#2=5`, a token the policy never produced);
    "near" writes a new operator's step the way the policy does (`1+2=5`) and accepts either.

    Fallible judges (`JUDGE_ERRORS`), each kind with its own probability in [0, 1]: `false_revise`, a chunk the rule
    finds right is flagged at a random non-empty step (a false REVISE); `missed_error`, a chunk the rule finds wrong
    is passed (KEEP); `wrong_correction`, a correction carries a wrong number (`corrupt_number`: its first result off
    by 1 or 2). Independent draws from one `random.Random(seed)`, so the `judge_votes` reviews of one chunk can
    disagree; a kind at 0 draws nothing and never fires, and with all three at 0 this is the exact judge."""
    from trl_mintrl.judges import FunctionJudge

    if steps_per_correction < 1:
        raise ValueError(f"steps_per_correction must be >= 1, got {steps_per_correction}")
    for name, rate in zip(JUDGE_ERRORS, (false_revise, missed_error, wrong_correction), strict=True):
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1], got {rate!r}")
    if notation not in NOTATIONS:
        raise ValueError(f"unknown notation {notation!r}; expected one of {NOTATIONS}")
    if notation == "far" and steps_per_correction == 1:
        correct = correct_step
    else:
        correct = functools.partial(correct_step, steps=steps_per_correction, notation=notation)
    review = review_from_start if from_start else review_steps
    if notation == "near":
        review = functools.partial(review, notation="near")
    if not (false_revise or missed_error or wrong_correction):
        return FunctionJudge(review, correct)
    rng = random.Random(seed)

    def fires(rate: float) -> bool:
        return rate > 0.0 and rng.random() < rate

    def fallible_review(question, prefix, steps, reference=None):
        index = review(question, prefix, steps, reference)
        if index is None:  # the rule finds the chunk right
            if fires(false_revise):
                candidates = [i for i, step in enumerate(steps) if step.strip()]
                return rng.choice(candidates) if candidates else None
            return None
        return None if fires(missed_error) else index

    def fallible_correct(question, prefix, reference=None):
        text = correct(question, prefix, reference)
        return corrupt_number(text, rng) if fires(wrong_correction) else text

    return FunctionJudge(fallible_review, fallible_correct)


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
