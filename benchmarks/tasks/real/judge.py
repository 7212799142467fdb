"""The rule judge for the real-model task: an oracle teacher that checks each line's computations against the
reference solution and writes the first missing reference step in the model's own phrasing.

A step is a line (the model writes one step per line). The review reads the chunk line by line, with the accepted
prefix before it (a line that began in the prefix and ends in the chunk is read whole), and flags the first wrong
line; its index is that of the step (of the `steps` the rollout gave) holding the line's start in the chunk, so the
rule holds whether the rollout splits at lines or at blank lines.

What counts (`check_line`):
- A computation is `E = c` where `E` is two or more numbers joined by `+ - * / x × ÷` (unit words may sit between a
  number and its operator: "28 stickers x 12 = 308"), `c` a number. It is right when (1) every number in `E` is
  established: written in the question, or the result of a reference step; (2) `E` evaluates exactly to `c`
  (precedence as usual, exact fractions: `28 / 3 = 9` is wrong); and (3) `c` is the result of a reference step.
  So a wrong result (`28 - 12 = 15`), a step copying a wrong number (`15 + 5 = 20` after it) and a true computation
  that is not the problem's (`28 + 12 = 40` where the question subtracts) are all wrong. The price: a correct route
  the reference does not take (`28 + 5 = 33`, then `33 - 12 = 21`) is flagged too; the problems are chains where
  that route is rare.
- An answer line (`#### N`, "the answer is N", `\\boxed{N}`) is right when N is the reference's final answer.
- Anything else (prose, restatements, "Jack has x stickers now.") is right: a wrong number written only in prose is
  caught where a computation uses it or at the answer line.
- An unfinished line (the chunk's last line, without its newline, when the request says the chunk was cut:
  `ReviewRequest.last_step_complete` False) is judged on what it has written: a computation or answer whose number
  reaches the end of the line is right while that number is the start of the right one ("= 1" for 16); anything
  already complete in it is judged as above.

Correction (`correct_step`): the first reference step whose result no complete line of the prefix has computed (a
right computation giving that value), as the reference's own sentence with its newline (at most ~50 characters,
well under 64 tokens); once every step is there, the answer line `#### N`. When the prefix ends inside a line that
the target sentence starts with, the correction completes it; otherwise it starts a new line. With
`writes_answer=False` (`rule_judge(writes_answer=False)`) the judge never writes the answer line: once every step is
there its correction is empty, so a wrong answer line is cut and the policy writes the answer itself. The reward
reads the first answer line, so a judge that writes it also makes everything the policy writes after it free. With
`answer_only=True` (`correct_with_answer`) every correction is the answer line, whatever steps are missing: where the
policy wrote one step and a wrong answer, the judge replaces the answer line instead of adding the missing step, so
an intervened rollout is about as long as the policy's own (a test of what lengthening corrections do, not a teacher).
With `lines=k` (`rule_judge(lines=k)`) a correction writes the next k lines the prefix lacks (steps, then the answer
line), and with `lines=None` all of them, the rest of the solution: more judge text a correction, the intensity
ablation's higher shares (`benchmarks/studies/intensity_real.py`). With `rewrite=True` (and `lines=None`) the first
chunk of a rollout is flagged at its first step whatever it says, so the correction, the whole solution, replaces the
rollout: the judge's share is then set by how many rollouts it reviews, not by where the policy errs (the ablation's
~35% arm, held there by `judge_token_target`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

from trl_mintrl.judges import FunctionJudge

_NUM = r"\$?\d+(?:,\d{3})*(?:\.\d+)?"
_OP = r"(?:[-+*/×÷−]|(?<=[ \t\d])x(?=[ \t\d]))"
_WORDS = r"(?:[ \t]+[A-Za-z]+){0,2}"
# within one line: `[ \t]`, never `\s`, so that a computation never spans a line break
COMPUTATION = re.compile(
    rf"(?P<expr>{_NUM}(?:{_WORDS}[ \t]*{_OP}[ \t]*{_NUM})+){_WORDS}[ \t]*=[ \t]*(?P<result>{_NUM})"
)
_FIRST = re.compile(_NUM)
_NEXT = re.compile(rf"{_WORDS}[ \t]*(?P<op>{_OP})[ \t]*(?P<number>{_NUM})")
ANSWER = re.compile(rf"(?:####|answer is:?|\\boxed\{{)[ \t]*(?P<result>{_NUM})", re.IGNORECASE)
_QUESTION_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


def number(text: str) -> Fraction:
    return Fraction(text.replace("$", "").replace(",", ""))


def parse_expr(expr: str) -> tuple[list[str], list[str]]:
    """A computation's left side (`COMPUTATION`'s `expr`) as its numbers and the operators between them."""
    first = _FIRST.match(expr)
    numbers, ops, at = [first.group()], [], first.end()
    while at < len(expr):
        step = _NEXT.match(expr, at)
        numbers.append(step.group("number"))
        ops.append(step.group("op"))
        at = step.end()
    return numbers, ops


def evaluate(expr: str) -> Fraction | None:
    """The value of a computation's left side (`*`/`/` before `+`/`-`, left to right), None on division by 0."""
    numbers, operators = parse_expr(expr)
    values, ops = [number(numbers[0])], []
    for op, operand in zip(operators, numbers[1:], strict=True):
        value = number(operand)
        if op in "*x×":
            values[-1] *= value
        elif op in "/÷":
            if value == 0:
                return None
            values[-1] /= value
        else:
            values.append(value)
            ops.append(op)
    total = values[0]
    for op, value in zip(ops, values[1:], strict=True):
        total = total + value if op == "+" else total - value
    return total


def operands(expr: str) -> list[Fraction]:
    return [number(n) for n in parse_expr(expr)[0]]


@dataclass(frozen=True)
class Reference:
    """A reference solution read back from its text: each step's sentence and result, and the final answer."""

    steps: tuple[str, ...]
    results: tuple[Fraction, ...]
    answer: Fraction
    answer_line: str

    @classmethod
    def parse(cls, reference: str | None) -> Reference:
        if not reference:
            raise ValueError("the rule judge needs the reference solution (the dataset's `solution` column)")
        lines = [line.strip() for line in reference.strip().splitlines() if line.strip()]
        answer = ANSWER.search(lines[-1])
        if answer is None:
            raise ValueError(f"reference has no final `#### N` line: {reference!r}")
        steps, results = [], []
        for line in lines[:-1]:
            found = COMPUTATION.search(line)
            if found is None:
                raise ValueError(f"reference step without a computation: {line!r}")
            steps.append(line)
            results.append(number(found.group("result")))
        return cls(tuple(steps), tuple(results), number(answer.group("result")), lines[-1])


def _partial_ok(written: str, right: Fraction) -> bool:
    """An unfinished number is right while the right value's digits start with it."""
    digits = written.replace("$", "").replace(",", "")
    return right.denominator == 1 and str(right.numerator).startswith(digits)


def check_line(line: str, established: set[Fraction], ref: Reference, unfinished: bool = False) -> bool:
    """Whether `line` is right by the rules of the module's docstring. `established`: the question's numbers and
    the reference's results; `unfinished`: the line may continue (its last number may be cut)."""
    end = len(line)
    for found in COMPUTATION.finditer(line):
        if not all(value in established for value in operands(found.group("expr"))):
            return False
        value = evaluate(found.group("expr"))
        if value is None or value not in ref.results:
            return False
        if unfinished and found.end() == end:
            if not _partial_ok(found.group("result"), value):
                return False
        elif number(found.group("result")) != value:
            return False
    for found in ANSWER.finditer(line):
        if unfinished and found.end() == end:
            if not _partial_ok(found.group("result"), ref.answer):
                return False
        elif number(found.group("result")) != ref.answer:
            return False
    return True


def established_numbers(question: str, ref: Reference) -> set[Fraction]:
    return {number(n) for n in _QUESTION_NUMBER.findall(question)} | set(ref.results)


def _lines(text: str) -> list[tuple[int, str]]:
    """(start offset, text with its newline) of each line of `text`."""
    out, offset = [], 0
    for line in text.splitlines(keepends=True):
        out.append((offset, line))
        offset += len(line)
    return out


def review_chunk(
    question: str,
    prefix: str,
    steps: list[str],
    reference: str | None = None,
    last_step_complete: bool = True,
    rewrite: bool = False,
) -> int | None:
    """The index in `steps` of the step holding the first wrong line of the chunk (`"".join(steps)`), else None;
    `rewrite`: 0 for a rollout's first chunk (empty `prefix`), whatever it says."""
    ref = Reference.parse(reference)
    if rewrite and not prefix:
        return 0
    established = established_numbers(question, ref)
    chunk = "".join(steps)
    text = prefix + chunk
    for start, line in _lines(text):
        if start + len(line) <= len(prefix):
            continue  # accepted before: only the chunk's lines (and one that straddles into it) are reviewed
        unfinished = not line.endswith("\n") and not last_step_complete
        if check_line(line, established, ref, unfinished):
            continue
        offset = max(start - len(prefix), 0)
        end = 0
        for index, step in enumerate(steps):
            end += len(step)
            if offset < end:
                return index
        return len(steps) - 1
    return None


def computed_results(text: str, question: str, ref: Reference) -> Counter:
    """How many times the complete, right lines of `text` compute each value."""
    established = established_numbers(question, ref)
    done = Counter()
    for _, line in _lines(text):
        if line.endswith("\n") and check_line(line, established, ref):
            done.update(number(f.group("result")) for f in COMPUTATION.finditer(line))
    return done


def next_step(question: str, prefix: str, ref: Reference) -> int:
    """The index of the first reference step the prefix has not computed (`len(ref.steps)`: all are there). A
    result the reference computes twice counts as computed for its second step only when computed twice."""
    done = computed_results(prefix, question, ref)
    needed = Counter()
    for index, result in enumerate(ref.results):
        needed[result] += 1
        if done[result] < needed[result]:
            return index
    return len(ref.steps)


def correct_step(
    question: str, prefix: str, reference: str | None = None, writes_answer: bool = True, lines: int | None = 1
) -> str:
    """The first reference step the prefix has not computed (or the answer line; nothing without `writes_answer`),
    ending with a newline; with `lines`, that many of the lines the prefix lacks (the steps from that one on, then
    the answer line), None: all of them (the rest of the solution)."""
    ref = Reference.parse(reference)
    rest = [*ref.steps[next_step(question, prefix, ref) :], *([ref.answer_line] if writes_answer else [])]
    rest = rest if lines is None else rest[:lines]
    return _written_after(prefix, "\n".join(rest)) if rest else ""


def correct_with_answer(question: str, prefix: str, reference: str | None = None) -> str:
    """The reference's answer line, whatever steps the prefix lacks: a correction about as long as the line it
    replaces, so that a judge-completed rollout is no longer than the policy's own."""
    return _written_after(prefix, Reference.parse(reference).answer_line)


def _written_after(prefix: str, target: str) -> str:
    """`target` as a line after `prefix`: completing the prefix's last line when that line is the start of it, on a
    new line otherwise."""
    partial = prefix.rsplit("\n", 1)[-1].lstrip()
    if not partial:
        return target + "\n"
    if target.startswith(partial):
        return target[len(partial) :] + "\n"
    return "\n" + target + "\n"


class RuleJudge(FunctionJudge):
    """`review_chunk` / `correct_step` as a `FunctionJudge`. `FunctionJudge` calls `review_fn` without the request's
    `last_step_complete`, which this rule reads: requests are routed to a review bound to their flag."""

    def __init__(
        self, writes_answer: bool = True, answer_only: bool = False, lines: int | None = 1, rewrite: bool = False
    ):
        correct = (
            correct_with_answer if answer_only else partial(correct_step, writes_answer=writes_answer, lines=lines)
        )
        super().__init__(partial(review_chunk, rewrite=rewrite), correct)
        self._cut = FunctionJudge(partial(review_chunk, last_step_complete=False, rewrite=rewrite), correct)

    def review(self, requests):
        complete = [request.last_step_complete for request in requests]
        whole = iter(super().review([r for r, c in zip(requests, complete, strict=True) if c]))
        cut = iter(self._cut.review([r for r, c in zip(requests, complete, strict=True) if not c]))
        return [next(whole) if c else next(cut) for c in complete]


def rule_judge(
    writes_answer: bool = True, answer_only: bool = False, lines: int | None = 1, rewrite: bool = False
) -> RuleJudge:
    """The oracle teacher for `MInTRLTrainer(judge=...)` on `benchmarks.tasks.real.task` datasets (reference column:
    `solution`); `writes_answer=False`: it never writes the answer line; `answer_only=True`: every correction is the
    answer line; `lines`: a correction writes that many of the missing lines, None: the rest of the solution;
    `rewrite=True`: every reviewed rollout is replaced by the whole solution (the module's docstring)."""
    if answer_only and not writes_answer:
        raise ValueError("answer_only=True writes nothing but the answer line: it needs writes_answer=True")
    if lines is not None and lines < 1:
        raise ValueError(f"lines must be >= 1 (reference lines a correction writes) or None (the rest), got {lines}")
    if rewrite and (lines is not None or answer_only or not writes_answer):
        raise ValueError("rewrite=True replaces the rollout with the whole solution: it needs lines=None, "
                         "writes_answer=True and answer_only=False")  # fmt: skip
    return RuleJudge(writes_answer, answer_only, lines, rewrite)
