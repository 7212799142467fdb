"""Step splitting and token-boundary cuts for the intervention loop (SPEC 2.1)."""

from __future__ import annotations

from collections.abc import Sequence


def split_steps(text: str) -> list[str]:
    """Split a chunk of reasoning into steps at blank lines; a fenced code block stays in one step.

    Separators stay attached to the step they end, so `"".join(split_steps(text)) == text` and a step index maps
    back to a character offset. A trailing unfinished step (the chunk was cut mid-step) is the last step; a chunk
    with no blank line is a single step. An unclosed code fence runs to the end of the chunk.
    """
    steps: list[str] = []
    current: list[str] = []
    in_fence = False
    step_has_content = False
    step_closed = False  # a blank line outside a fence ended the step; more blank lines still belong to it
    for line in text.splitlines(keepends=True):
        blank = not line.strip()
        if not blank and step_closed:
            steps.append("".join(current))
            current, step_has_content, step_closed = [], False, False
        current.append(line)
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if blank and step_has_content and not in_fence:
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
