"""The studies' figures: matplotlib without a display, a figure laid out and saved, means drawn with their 95%
intervals (error bars, or a band along a curve), and the grids of a learning study's runs (held-out curves and logged
metrics, a row per regime of its plan), so that every study's plots are made and written the same way."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.lib.records import runs_of
from benchmarks.lib.stats import mean_interval


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (no display: the studies run on servers and in workers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, dpi: int) -> Path:
    """Lay `fig` out, write it to `path` at `dpi` and close it; returns `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def interval_errorbar(ax, xs, intervals, **style) -> list[float]:
    """Means with their 95% intervals as error bars, in points (no bar where an interval has no bounds); `style`
    goes to `errorbar` (round markers and caps of 4 unless it says); returns the plotted means."""
    ys = [100 * i.mean for i in intervals]
    err = [
        [100 * (i.mean - i.low) if i.low is not None else 0 for i in intervals],
        [100 * (i.high - i.mean) if i.high is not None else 0 for i in intervals],
    ]
    ax.errorbar(xs, ys, yerr=err, **{"marker": "o", "capsize": 4, **style})
    return ys


def mean_band(ax, xs, per_x, color, label, style, scale=100):
    """The mean of each x's values (times `scale`) as a line, with its 95% t-interval as a band where every x has
    more than one value."""
    means = [scale * statistics.fmean(v) for v in per_x]
    ax.plot(xs, means, style, color=color, label=label, marker="o" if scale == 100 else None, ms=3)
    if all(len(v) > 1 for v in per_x):
        intervals = [mean_interval(v) for v in per_x]
        ax.fill_between(
            xs, [scale * i.low for i in intervals], [scale * i.high for i in intervals], color=color, alpha=0.12
        )


def curve_grid(results: dict, path: Path) -> Path:
    """Held-out pass@1 and pass@8 (%) of the curve set against the optimizer step: a row per regime of the plan, a
    line per arm (GRPO's dashed) with the mean over its runs and the 95% band; step 0 is the regime's baseline's
    `curve0` where it has one. Saved at `path`."""
    plt, settings = pyplot(), results["settings"]
    regimes = list(settings["plan"])
    fig, axes = plt.subplots(len(regimes), 2, figsize=(13, 4.2 * len(regimes)), squeeze=False)
    for row, regime in zip(axes, regimes, strict=True):
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        for ax, k in zip(row, ("pass@1", "pass@8"), strict=True):
            drawn = False
            for n, label in enumerate(settings["plan"][regime]):
                runs = runs_of(results, regime, label)
                if not runs:
                    continue
                per_step = {
                    int(s): [r["curve"][s][k] for r in runs if k in r["curve"].get(s, {})]
                    for s in {s for r in runs for s in r["curve"]}
                }
                if base is not None and k in base.get("curve0", {}):
                    per_step[0] = [base["curve0"][k]]
                steps = sorted(s for s, values in per_step.items() if values)  # old records: no pass@8 points
                if not steps:
                    continue
                per_step = [per_step[s] for s in steps]
                mean_band(ax, steps, per_step, f"C{n % 10}", label, "--" if "grpo" in label else "-")
                drawn = True
            ax.set_xlabel("optimizer step")
            ax.set_ylabel(f"held-out {k} (%), {settings['curve_prompts']} problems")
            ax.set_title(f"{regime}: mean over seeds, band = 95% t-interval")
            if drawn:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, f"no {k} curve points recorded", ha="center", transform=ax.transAxes)
    return save(fig, path, 110)


def log_grid(results: dict, panels: list[tuple[str, tuple[str, ...]]], path: Path) -> Path:
    """Logged metrics against the optimizer step: a row per regime of the plan, a panel per `(title, keys)` (the
    first of `keys` an entry logged), a line per arm (GRPO's dashed) with the mean over its runs and the 95% band.
    Saved at `path`."""
    plt, settings = pyplot(), results["settings"]
    regimes = list(settings["plan"])
    fig, axes = plt.subplots(len(regimes), len(panels), figsize=(4.2 * len(panels), 3.4 * len(regimes)), squeeze=False)
    for row, regime in zip(axes, regimes, strict=True):
        for ax, (title, keys) in zip(row, panels, strict=True):
            for n, label in enumerate(settings["plan"][regime]):
                by_step: dict[int, list[float]] = {}
                for run in runs_of(results, regime, label):
                    for entry in run["logs"]:
                        key = next((k for k in keys if k in entry), None)
                        if key is not None:
                            by_step.setdefault(entry["step"], []).append(entry[key])
                if by_step:
                    xs = sorted(by_step)
                    style = "--" if "grpo" in label else "-"
                    mean_band(ax, xs, [by_step[x] for x in xs], f"C{n % 10}", label, style, 1)
            ax.set_title(f"{regime}: {title}", fontsize=9)
            ax.set_xlabel("optimizer step")
            ax.legend(fontsize=6)
    return save(fig, path, 110)
