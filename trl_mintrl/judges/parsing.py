"""Strict parsing of judge answers.

Only the last non-empty line of a review counts, and it must be `VERDICT: KEEP` or `VERDICT: REVISE <k>`: a judge
that rambles, hedges or names a step that does not exist gives a failed verdict (treated as KEEP and counted),
never a guess. Tolerated: case, spacing, brackets around the line or around k, markdown emphasis, a final period.

Reasoning blocks (`<think> ... </think>`, see `trl_mintrl.text.outside_thinking`) are dropped; a thinking template
may open `<think>` in the prompt, so the answer can hold only the closing tag. An answer that opens `<think>` and
never closes it, or that hit its token cap before ending, is unusable: the judge was still thinking.
"""

from __future__ import annotations

import re

from ..text import outside_thinking
from .base import Correction, Verdict

_VERDICT_LINE = re.compile(r"verdict\s*:\s*(?:(keep)|revise\s*[\[(<]?\s*(\d+)\s*[\])>]?)", re.IGNORECASE)
_EMPHASIS = "*_`"
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\r?\n)+")
_LABEL = re.compile(
    r"^\s*(?:[*_#>]+\s*)?(?:correction|corrected step|next step|continuation|revised step)\s*[*_]*\s*:[*_]*[ \t]*",
    re.IGNORECASE,
)


def parse_verdict(text: str, num_steps: int) -> Verdict:
    """Parse a review answer into a 0-based `Verdict`; anything but a well-formed, in-range last line fails."""
    answer = strip_reasoning(text)
    lines = [line.strip() for line in (answer or "").splitlines() if line.strip()]
    if not lines:
        return Verdict(failed=True)
    line = lines[-1].strip(_EMPHASIS + " \t").rstrip(".").strip(_EMPHASIS + " \t")
    if line.startswith("[") and line.endswith("]"):
        line = line[1:-1].strip()
    match = _VERDICT_LINE.fullmatch(line)
    if match is None:
        return Verdict(failed=True)
    if match.group(1):
        return Verdict(wrong_step=None)
    k = int(match.group(2))
    if not 1 <= k <= num_steps:
        return Verdict(failed=True)
    return Verdict(wrong_step=k - 1)


def strip_reasoning(text: str | None) -> str | None:
    """The answer outside reasoning blocks; None when a `<think>` block is left open."""
    answer, left_open = outside_thinking(text or "")
    return None if left_open else answer


def clean_correction(text: str | None) -> str | None:
    """The correction text without a reasoning block, a label ("Correction:"), leading blank lines or trailing
    spaces. The first line keeps its indentation (code) and up to two final newlines are kept (a correction that
    ends a line or a step), so the policy continues where the judge stopped.

    An empty answer is an empty correction, which the rollout loop allows; None when a `<think>` block is left open.
    """
    answer = strip_reasoning(text)
    if answer is None:
        return None
    answer = _LEADING_BLANK_LINES.sub("", _LABEL.sub("", answer, count=1))
    body = answer.rstrip()
    return body + "\n" * min(answer[len(body) :].count("\n"), 2) if body else ""


def parse_correction(text: str | None, truncated: bool) -> Correction:
    """A `Correction` from a judge's answer; failed when the answer hit its token cap before ending (likely cut in
    the middle of reasoning or of a sentence) or leaves a `<think>` block open. Failed corrections are never
    inserted: the rollout keeps the chunk as if the judge had said KEEP."""
    cleaned = None if truncated else clean_correction(text)
    return Correction(failed=True) if cleaned is None else Correction(cleaned)
