"""benchmarks/studies/time_to_accuracy.py: steps and seconds to GRPO's final accuracy, from recorded curves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _run(label: str, seed: int, curve: dict[int, float], seconds: float = 480.0) -> dict:
    return {"regime": "in-band", "group": "main", "label": label, "seed": seed, "steps": 48, "train_seconds": seconds,
            "curve": {str(step): {"pass@1": value, "pass@8": value} for step, value in curve.items()}}  # fmt: skip


def test_the_first_curve_point_at_grpos_final_value_and_its_share_of_the_seconds():
    """GRPO ends at 0.1 and 0.3 (target 0.2); the arm reaches it at step 12 on seed 0 (0.2 counts: at or above) and
    at 36 on seed 1; another arm never does."""
    from benchmarks.studies.time_to_accuracy import table

    runs = [
        _run("grpo", 0, {12: 0.0, 48: 0.1}),
        _run("grpo", 1, {12: 0.0, 48: 0.3}),
        _run("arm", 0, {12: 0.2, 24: 0.1, 48: 0.5}),
        _run("arm", 1, {12: 0.1, 24: 0.15, 36: 0.25, 48: 0.3}, seconds=960.0),
        _run("never", 0, {12: 0.0, 48: 0.19}),
        {**_run("arm", 2, {12: 0.9}), "regime": "reachable"},  # another regime: left out
    ]
    target, rows = table(runs)
    assert target == pytest.approx(0.2)
    arm = next(r for r in rows if r["arm"] == "arm")
    assert (arm["seeds"], arm["reached"]) == (2, 2)
    assert arm["steps"].mean == pytest.approx(24.0)  # 12 and 36
    assert arm["seconds"].mean == pytest.approx((480 * 12 / 48 + 960 * 36 / 48) / 2)
    never = next(r for r in rows if r["arm"] == "never")
    assert never["reached"] == 0 and never["steps"] is None


def test_learning_async_runs_read_as_learning_runs():
    """learning_async.py's records (an arm, the steps in the settings) become `async:<arm>` runs; one without a
    curve (recorded before curves were) is skipped; learning.py's records pass unchanged."""
    from benchmarks.studies.time_to_accuracy import as_learning_runs

    saved = {
        "settings": {"steps": 48},
        "runs": [
            {"arm": "async-s2", "seed": 0, "train_seconds": 100.0, "curve": {"12": {"pass@1": 0.1}}},
            {"arm": "sync", "seed": 0, "train_seconds": 90.0},
        ],
    }
    (run,) = as_learning_runs(saved)
    assert (run["label"], run["regime"], run["steps"], run["seed"]) == ("async:async-s2", "in-band", 48, 0)
    learning = {"settings": {}, "runs": [_run("grpo", 0, {48: 0.1})]}
    assert as_learning_runs(learning) == learning["runs"]
