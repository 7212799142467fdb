"""Step splitting and token-boundary cuts for the intervention loop (SPEC 2.1)."""

from __future__ import annotations

import re
from collections.abc import Sequence

# A code-fence line (CommonMark): up to 3 spaces, then 3+ backticks or tildes, then an optional info string, which
# for backtick fences holds no backtick (so "```x```" is inline code, not a fence).
_FENCE = re.compile(r"^ {0,3}(?P<marks>`{3,}|~{3,})(?P<info>[^\n]*)$")


def _fence_marks(line: str, open_fence: str | None) -> str | None:
    """The fence a line opens (its marks) when none is open; "" when it closes `open_fence`; None otherwise."""
    match = _FENCE.match(line.rstrip("\r\n"))
    if match is None:
        return None
    marks, info = match.group("marks"), match.group("info")
    if open_fence is None:
        return None if marks[0] == "`" and "`" in info else marks
    closes = marks[0] == open_fence[0] and len(marks) >= len(open_fence) and not info.strip()
    return "" if closes else None


def open_fence_at_end(text: str) -> str | None:
    """The marks of the code fence still open after `text` (e.g. "```"), or None. Only whole lines count: an
    unfinished last line cannot be read yet."""
    fence = None
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        marks = _fence_marks(line, fence)
        if marks is not None:
            fence = marks or None
    return fence


def split_steps(text: str, prefix: str = "") -> list[str]:
    """Split a chunk into steps at blank lines and at code-fence lines (the MInTRL paper's steps).

    A fence line that opens a code block starts a step; one that closes it ends the step. Inside a code block blank
    lines split too, so a judge can keep one correct function and revise the next. Separators stay attached to the
    step they end, so `"".join(split_steps(text)) == text` and a step index maps back to a character offset. A
    trailing unfinished step (the chunk was cut mid-step) is the last step; a chunk with no boundary is one step.

    Args:
        text: the chunk to split.
        prefix: the completion accepted before the chunk: it says whether the chunk starts inside a code block, and
            an unfinished last line of it continues into the chunk's first line.
    """
    fence = open_fence_at_end(prefix)
    carried = "" if not prefix or prefix.endswith("\n") else prefix.rsplit("\n", 1)[-1]
    steps: list[str] = []
    current: list[str] = []
    step_has_content = False
    step_closed = False  # a blank line or a closing fence ended the step; more blank lines still belong to it
    for line in text.splitlines(keepends=True):
        blank = not line.strip()
        marks = _fence_marks(carried + line, fence)
        carried = ""
        opens = marks is not None and fence is None
        if current and ((opens and step_has_content) or (not blank and step_closed)):
            steps.append("".join(current))
            current, step_has_content, step_closed = [], False, False
        current.append(line)
        if marks is not None:
            fence = marks or None
            step_closed = not opens
        elif blank and step_has_content:
            step_closed = True
        step_has_content = step_has_content or not blank
    if current:
        steps.append("".join(current))
    return steps


def cut_point(token_ids: Sequence[int], num_chars: int, decode) -> int:
    """The largest k such that `decode(token_ids[:k])` is a prefix of the chunk's first `num_chars` characters.

    Used to cut a chunk on a token boundary at or before the start of the first wrong step: tokens never straddle
    the cut, and a token that only partly belongs to the kept steps is dropped with the wrong step.
    """
    full_text = decode(token_ids)
    kept = full_text[:num_chars]
    lo, hi = 0, len(token_ids)
    while lo < hi:  # largest k with len(decode(ids[:k])) <= num_chars (decoded length grows with k)
        mid = (lo + hi + 1) // 2
        if len(decode(token_ids[:mid])) <= num_chars:
            lo = mid
        else:
            hi = mid - 1
    k = lo
    while k > 0 and not kept.startswith(decode(token_ids[:k])):  # e.g. a split multi-byte character
        k -= 1
    return k
