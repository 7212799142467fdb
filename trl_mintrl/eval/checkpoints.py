"""pass@k over a training run's checkpoints: which `checkpoint-N/` folders to evaluate, the table over steps, the
curve, and the best checkpoint (the MInTRL paper reports the best of checkpoints saved every 50 steps)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..resume import checkpoint_problem, numbered_checkpoints

logger = logging.getLogger(__name__)


def run_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete `checkpoint-N/` in a training run's output folder, by step. A folder a crash
    cut short (see `trl_mintrl.resume.checkpoint_problem`) is left out with a warning."""
    found = []
    for step, folder in numbered_checkpoints(str(run_dir)):
        problem = checkpoint_problem(folder)
        if problem is None:
            found.append((step, Path(folder)))
        else:
            logger.warning("Not evaluating %s: incomplete (%s).", folder, problem)
    return found


def mean_over_benchmarks(summaries: dict[str, dict], metric: str) -> float | None:
    values = [s[metric] for s in summaries.values() if s.get(metric) is not None]
    return sum(values) / len(values) if values else None


def best_checkpoint(results: dict[int, dict[str, dict]], metric: str) -> tuple[int, float] | None:
    """(step, score) of the checkpoint with the highest `metric` averaged over benchmarks; the earliest on ties."""
    scored = [(step, mean_over_benchmarks(s, metric)) for step, s in sorted(results.items())]
    scored = [(step, score) for step, score in scored if score is not None]
    return max(scored, key=lambda item: (item[1], -item[0])) if scored else None


def steps_table(results: dict[int, dict[str, dict]], ks: list[int]) -> str:
    """Markdown table: one row per checkpoint step, one column per benchmark x pass@k, plus the mean, in percent
    (the headers say so: checkpoints.json holds the same values as fractions)."""
    benchmarks = sorted({name for summaries in results.values() for name in summaries})
    columns = [(name, k) for name in benchmarks for k in ks]
    header = ["step", *(f"{name} pass@{k} (%)" for name, k in columns), *(f"mean pass@{k} (%)" for k in ks)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for step, summaries in sorted(results.items()):
        cells = [_percent(summaries.get(name, {}).get(f"pass@{k}")) for name, k in columns]
        cells += [_percent(mean_over_benchmarks(summaries, f"pass@{k}")) for k in ks]
        lines.append("| " + " | ".join([str(step), *cells]) + " |")
    return "\n".join(lines)


def plot_steps(results: dict[int, dict[str, dict]], ks: list[int], path: Path) -> Path | None:
    """pass@k (mean over benchmarks) against the step; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = sorted(results)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for k in ks:
        values = [mean_over_benchmarks(results[s], f"pass@{k}") for s in steps]
        ax.plot(steps, [None if v is None else 100 * v for v in values], marker="o", label=f"pass@{k}")
    ax.set_xlabel("checkpoint step")
    ax.set_ylabel("% (mean over benchmarks)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"
