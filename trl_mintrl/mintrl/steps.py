"""Step splitting and token-boundary cuts for the intervention loop."""

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


# Where a chunk splits into steps (`MInTRLConfig.step_split`). "blank_line": the paper's steps, paragraphs ended by
# a blank line; "line": every line is a step (models that write one step per line); "auto": the paper's steps when
# the chunk has a blank line between two of its lines, else lines. In every mode code blocks split at their fence
# lines and at blank lines inside them, never at each line of code.
STEP_SPLITS = ("line", "blank_line", "auto")


def split_steps(text: str, prefix: str = "", mode: str = "blank_line") -> list[str]:
    """Split a chunk into steps: at blank lines and code-fence lines (the MInTRL paper's steps), or at every line.

    A fence line that opens a code block starts a step; one that closes it ends the step. Inside a code block blank
    lines split too, so a judge can keep one correct function and revise the next; lines of code never do. Outside
    code, `mode` says where a step ends:

    - "blank_line" (the paper's): at a blank line; a chunk with no boundary is one step.
    - "line": at every line break; blank lines stay with the step before them.
    - "auto": "blank_line" when the chunk has a blank line with text before and after it (outside code), else
      "line": a model that writes paragraphs gets the paper's steps, one that writes one step per line gets lines.

    Separators stay attached to the step they end, so `"".join(split_steps(text, prefix, mode)) == text` and a step
    index maps back to a character offset. A trailing unfinished step (the chunk was cut mid-step) is the last step.

    Args:
        text: the chunk to split.
        prefix: the completion accepted before the chunk: it says whether the chunk starts inside a code block, and
            an unfinished last line of it continues into the chunk's first line.
        mode: one of `STEP_SPLITS`. The default is the paper's; the trainers use `MInTRLConfig.step_split`.
    """
    if mode not in STEP_SPLITS:
        raise ValueError(f"split_steps(mode={mode!r}): mode must be one of {STEP_SPLITS}")
    if mode == "auto":
        mode = "blank_line" if _has_paragraph_break(text, prefix) else "line"
    return _split(text, prefix, by_line=mode == "line")


def _lines(text: str, prefix: str):
    """(line, its fence marks or None, the fence open after it) for each line of `text`, continuing `prefix`."""
    fence = open_fence_at_end(prefix)
    carried = "" if not prefix or prefix.endswith("\n") else prefix.rsplit("\n", 1)[-1]
    for line in text.splitlines(keepends=True):
        marks = _fence_marks(carried + line, fence)
        carried = ""
        if marks is not None:
            fence = marks or None
        yield line, marks, fence


def _has_paragraph_break(text: str, prefix: str) -> bool:
    """Whether `text` has a blank line outside code with a non-blank line before it and one after it."""
    seen_text = pending_break = False
    for line, marks, fence in _lines(text, prefix):
        if marks is not None or fence is not None:  # a fence line or code: not a paragraph break
            pending_break = False
            seen_text = marks == ""  # a closing fence line ends text before a possible blank line
            continue
        if not line.strip():
            pending_break = pending_break or seen_text
        elif pending_break:
            return True
        else:
            seen_text = True
    return False


def _split(text: str, prefix: str, by_line: bool) -> list[str]:
    steps: list[str] = []
    current: list[str] = []
    step_has_content = False
    step_closed = False  # a boundary ended the step; more blank lines still belong to it
    fence = open_fence_at_end(prefix)
    for line, marks, fence_after in _lines(text, prefix):
        blank = not line.strip()
        opens = marks is not None and fence is None
        fence = fence_after
        if current and ((opens and step_has_content) or (not blank and step_closed)):
            steps.append("".join(current))
            current, step_has_content, step_closed = [], False, False
        current.append(line)
        if marks is not None:
            step_closed = not opens
        elif blank and step_has_content:
            step_closed = True
        elif by_line and not blank and fence is None and line.endswith(("\n", "\r")):
            step_closed = True  # a whole line of text outside code
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
