"""Strict parsing of judge answers.

Only the last non-empty line of a review counts, and it must be `VERDICT: KEEP` or `VERDICT: REVISE <k>`: a judge
that rambles, hedges or names a step that does not exist gives a failed verdict (treated as KEEP and counted),
never a guess. Tolerated: case, spacing, brackets around the line or around k, markdown emphasis, a final period.
"""

from __future__ import annotations

import re

from .base import Verdict

_VERDICT_LINE = re.compile(r"verdict\s*:\s*(?:(keep)|revise\s*[\[(<]?\s*(\d+)\s*[\])>]?)", re.IGNORECASE)
_EMPHASIS = "*_`"
_THINK_BLOCK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_LABEL = re.compile(
    r"^\s*(?:[*_#>]+\s*)?(?:correction|corrected step|next step|continuation|revised step)\s*[*_]*\s*:[*_]*\s*",
    re.IGNORECASE,
)


def parse_verdict(text: str, num_steps: int) -> Verdict:
    """Parse a review answer into a 0-based `Verdict`; anything but a well-formed, in-range last line fails."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
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


def clean_correction(text: str) -> str:
    """The correction text without a leading reasoning block, label ("Correction:") or surrounding whitespace.

    Never fails: an empty answer is an empty correction, which the rollout loop allows.
    """
    text = _THINK_BLOCK.sub("", text or "")
    return _LABEL.sub("", text, count=1).strip()
