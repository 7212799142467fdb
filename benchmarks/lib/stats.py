"""Statistics for the benchmark reports: mean ± std over seeds and paired differences with 95% t-intervals.

No scipy: the two-sided 95% quantiles of Student's t for 1-30 degrees of freedom are tabulated, larger ones use the
Cornish-Fisher expansion around the normal quantile (error < 1e-3 from 30 on).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# t_{0.975, df} for df = 1..30
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964


def t_quantile_975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (a two-sided 95% interval's half-width / SE)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Interval:
    """Mean of `n` values with its sample std and 95% t-interval (`low`, `high` are None when n < 2)."""

    mean: float
    std: float | None
    low: float | None
    high: float | None
    n: int

    @property
    def resolved(self) -> bool:
        """The interval excludes zero."""
        return self.low is not None and (self.low > 0 or self.high < 0)


def mean_interval(values: list[float]) -> Interval:
    """Mean, std and 95% t-interval of the mean."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, None, None, None, len(values))
    std = statistics.stdev(values)
    half = t_quantile_975(len(values) - 1) * std / math.sqrt(len(values))
    return Interval(mean, std, mean - half, mean + half, len(values))


def paired_difference(a: dict, b: dict) -> Interval | None:
    """`a - b` paired by key (seed) over the keys both have, with its 95% t-interval; None when none are shared."""
    keys = sorted(set(a) & set(b))
    return mean_interval([a[k] - b[k] for k in keys]) if keys else None


def format_interval(interval: Interval | None, scale: float = 100.0, digits: int = 1) -> str:
    """`+2.0 [-1.3, +5.3]` (scaled, e.g. to points); the value alone when there is no interval."""
    if interval is None:
        return "-"
    if interval.low is None:
        return f"{scale * interval.mean:+.{digits}f}"
    return f"{scale * interval.mean:+.{digits}f} [{scale * interval.low:+.{digits}f}, {scale * interval.high:+.{digits}f}]"


def format_ratio(interval: Interval) -> str:
    """`1.23 [1.10, 1.40]`: a ratio's mean and interval; the mean alone when there is no interval."""
    if interval.low is None:
        return f"{interval.mean:.2f}"
    return f"{interval.mean:.2f} [{interval.low:.2f}, {interval.high:.2f}]"


def format_mean_std(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{scale * values[0]:.{digits}f}"
    return f"{scale * statistics.fmean(values):.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"


def format_amount(interval: Interval | None) -> str:
    """`24 [12, 36]`: an amount's mean and interval (steps, seconds: the interval's low end at 0 at least); `-` for
    None, the mean alone when there is no interval."""
    if interval is None:
        return "-"
    if interval.low is None:
        return f"{interval.mean:.0f}"
    return f"{interval.mean:.0f} [{max(interval.low, 0):.0f}, {interval.high:.0f}]"
