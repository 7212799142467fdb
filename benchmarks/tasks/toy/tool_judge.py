"""The tool task's rule judge (`tool_judge`, a `FunctionJudge` reading the conversation): while a register of the
problem is unread, the current turn must be calls to unread registers, each once; the first step with anything else is
flagged and the correction is the next missing call in the policy's own format. `check_steps=True` also checks the
arithmetic with the read values (the base toy's rule judge)."""

from __future__ import annotations

import re

from .tool_task import ToolProblem, call_text, parse_tool_question

_CALL = re.compile(r"\[get name=([A-Za-z])\]")
_RESULT = re.compile(r"^\s*([A-Za-z])=(\d+)\s*$")


def registers_read(conversation) -> set[str]:
    """Registers whose value a tool result in `conversation` gave (`x=v`)."""
    read = set()
    for message in conversation or []:
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            match = _RESULT.match(message["content"])
            if match:
                read.add(match.group(1))
    return read


def _valid_calls_length(text: str, unread: list[str]) -> tuple[int, list[str]]:
    """Length of the longest start of `text` that is calls to distinct unread registers (an unfinished last call
    counts when it is the start of a right one), and the registers those complete calls read."""
    pos, called = 0, []
    while pos < len(text):
        match = _CALL.match(text, pos)
        if match and match.group(1) in unread and match.group(1) not in called:
            called.append(match.group(1))
            pos = match.end()
            continue
        rest = text[pos:]
        if any(call_text(r).startswith(rest) for r in unread if r not in called):
            return len(text), called  # an unfinished right call at the end
        break
    return pos, called


def review_calls(question, prefix, steps, reference=None, conversation=None, check_steps: bool = False):
    """Index in `steps` of the step holding the first wrong or missing call of the current turn, else None."""
    problem = parse_tool_question(question)
    read = registers_read(conversation)
    unread = [r for r in problem.registers if r not in read]
    if not unread:
        if not check_steps:
            return None
        from .task import review_steps

        return review_steps(_numeric_question(problem, conversation), prefix, steps)
    text = prefix + "".join(steps)
    good, _ = _valid_calls_length(text, unread)
    if good >= len(text.rstrip()):
        return None
    offset, end = good - len(prefix), 0
    if offset < 0:
        return 0
    for i, step in enumerate(steps):
        end += len(step)
        if offset < end:
            return i
    return len(steps) - 1


def correct_calls(question, prefix, reference=None, conversation=None, check_steps: bool = False) -> str:
    """The next missing call in the policy's format (`[get name=a]`); after every read, "" (or, with `check_steps`,
    the base toy's next step with the read values)."""
    problem = parse_tool_question(question)
    read = registers_read(conversation)
    unread = [r for r in problem.registers if r not in read]
    if not unread:
        if not check_steps:
            return ""
        from .task import correct_step

        return correct_step(_numeric_question(problem, conversation), prefix)
    _, called = _valid_calls_length(prefix, unread)
    missing = [r for r in unread if r not in called]
    if not missing:
        return ""
    complete = _complete_calls_length(prefix, unread)
    partial = prefix[complete:]  # an unfinished right call at the prefix's end (a chunk cut inside it): finish it
    for register in missing:
        if partial and call_text(register).startswith(partial):
            return call_text(register)[len(partial) :]
    return call_text(missing[0])


def _complete_calls_length(text: str, unread: list[str]) -> int:
    """Length of the start of `text` made of complete calls to distinct unread registers."""
    pos, called = 0, []
    while (match := _CALL.match(text, pos)) and match.group(1) in unread and match.group(1) not in called:
        called.append(match.group(1))
        pos = match.end()
    return pos


def _numeric_question(problem: ToolProblem, conversation) -> str:
    values = {}
    for message in conversation or []:
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            match = _RESULT.match(message["content"])
            if match:
                values[match.group(1)] = int(match.group(2))
    return problem.numeric(values).question


def tool_judge(check_steps: bool = False):
    """The rule judge: flags the first wrong or missing call and writes the next right one (`review_calls`,
    `correct_calls`)."""
    from trl_mintrl.judges import FunctionJudge

    def review(question, prefix, steps, reference, conversation):
        return review_calls(question, prefix, steps, reference, conversation, check_steps)

    def correct(question, prefix, reference, conversation):
        return correct_calls(question, prefix, reference, conversation, check_steps)

    return FunctionJudge(review, correct)
