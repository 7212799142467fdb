"""Are the judge's corrections being absorbed? A trend test on the policy's NLL of the judge's tokens.

MInTRL trains on judge tokens, so the policy's NLL of them falls as it internalises the corrections. A judge that
writes far from the student (another notation, names or step format) keeps that NLL high: on the toy benchmark the
far judge's corrections (`7#5=14`, a token the policy never wrote) went from 3.3 to 1.7 nats in 20 steps and garbled
the policy's own steps, while the same corrections in the policy's notation (`7+5=14`) fell from 1.6 to 0.7 within
12 steps. The tracker fits an exponential trend to the last `window` intervention steps' NLL and calls the
corrections *not absorbed* when the trend still ends above `max_nll` and has fallen by less than `min_fall` (a
share) over the window: a high NLL that falls fast is being absorbed, and a low one needs nothing.

It is fed the NLL sums that the trainer has already reduced over all processes, so every process takes the same
decision at the same step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_MIN_NLL = 1e-6  # the fit takes log NLL: an NLL of 0 (judge tokens the policy is certain of) is clamped to this


@dataclass(frozen=True)
class Trend:
    """The fitted trend over a full window: `level` is its NLL at the window's last step (nats per judge token),
    `fall` its relative fall across the window (0.5: halved; negative: rising)."""

    level: float
    fall: float
    not_absorbed: bool


class AbsorptionTracker:
    """One judge-token NLL per intervention step, the trend of the last `window` of them, and a once-per-run flag.

    The trainer computes the NLL once per loss computation (several per optimizer step with gradient accumulation), so
    `update` sums what it is given per step and closes a step when the next one starts; steps without judge tokens
    (no correction, or after the intervention phase) are not intervention steps and are left out.
    """

    def __init__(self, window: int, max_nll: float, min_fall: float):
        self.window, self.max_nll, self.min_fall = window, max_nll, min_fall
        self.nll: list[float] = []  # the last `window` closed intervention steps' NLL, oldest first
        self.pending: list[float] | None = None  # [step, NLL sum, judge tokens] of the step being summed
        self.warned = False

    def update(self, step: int, nll_sum: float, tokens: float) -> tuple[Trend | None, bool]:
        """Add one loss computation of optimizer step `step`. Returns the trend over the last `window` closed
        intervention steps (None until there are that many) and whether to warn now (True once per run, at the first
        trend that is not absorbed)."""
        if self.pending is not None and self.pending[0] != step:
            _, total, count = self.pending
            if count > 0:
                self.nll = [*self.nll, total / count][-self.window :]
            self.pending = None
        if self.pending is None:
            self.pending = [step, 0.0, 0.0]
        self.pending[1] += nll_sum
        self.pending[2] += tokens
        trend = self.trend()
        warn = trend is not None and trend.not_absorbed and not self.warned
        self.warned = self.warned or warn
        return trend, warn

    def trend(self) -> Trend | None:
        """Least-squares line through log NLL over the full window: an exponential trend, less sensitive to one noisy
        step than the window's two ends and, unlike a line through the NLL itself, never fitted below zero."""
        if len(self.nll) < self.window:
            return None
        logs = [math.log(max(v, _MIN_NLL)) for v in self.nll]
        n = len(logs)
        x_mean, y_mean = (n - 1) / 2, sum(logs) / n
        slope = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(logs)) / sum((i - x_mean) ** 2 for i in range(n))
        level = math.exp(y_mean + slope * x_mean)
        fall = 1.0 - math.exp(slope * (n - 1))
        return Trend(level, fall, level > self.max_nll and fall < self.min_fall)

    def state_dict(self) -> dict:
        return {"nll": list(self.nll), "pending": self.pending, "warned": self.warned}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`; raises KeyError/TypeError/ValueError on a malformed state (the resume is refused)."""
        nll, pending, warned = state["nll"], state["pending"], state["warned"]
        if not isinstance(nll, list) or not isinstance(warned, bool):
            raise TypeError(f"judge absorption state has nll={nll!r}, warned={warned!r}")
        if pending is not None and (not isinstance(pending, list) or len(pending) != 3):
            raise ValueError(f"judge absorption state has pending={pending!r}, not [step, NLL sum, tokens]")
        self.nll = [float(v) for v in nll][-self.window :]
        self.pending = None if pending is None else [int(pending[0]), float(pending[1]), float(pending[2])]
        self.warned = warned


def warn_not_absorbed(args, trend: Trend) -> None:
    """The once-per-run warning: what the trend says, the likely cause and the settings that address it."""
    logger.warning(
        "MInTRL judge: corrections are not being absorbed. Over the last %d intervention steps the policy's NLL of "
        "the judge's tokens ends at %.2f nats per token (above absorption_max_nll=%s) and fell by %.0f%% (less than "
        "absorption_min_fall=%s). Likely cause: the judge writes far from the student, in a notation, names or step "
        "format the policy does not produce (e.g. the reference solution's), so the policy learns its corrections "
        "slowly and they can garble its own steps. Fixes: corrections that continue in the student's notation (the "
        "shipped judge_correction_template presets 'math' and 'code' ask for it; a custom template or a judge object "
        "should too), a judge closer to the student (judge='self' or 'base', or a model of the student's family), or "
        "fewer judge tokens (max_correction_tokens=%d, max_reviews=%d). Shown once per run; mintrl/judge_nll_trend "
        "and mintrl/corrections_not_absorbed are logged every intervention step.",
        args.absorption_window,
        trend.level,
        args.absorption_max_nll,
        100 * trend.fall,
        args.absorption_min_fall,
        args.max_correction_tokens,
        args.max_reviews,
    )
