"""benchmarks/studies/learning_async.py without a server: both trainers get the same MInTRL settings, and the report pairs
each asynchronous run with the synchronous run of its seed, computed from the JSON alone."""

from __future__ import annotations

import dataclasses

from benchmarks.studies import learning_async
from trl_mintrl.mintrl.config import MInTRLFields


def test_every_arm_trains_with_the_same_mintrl_settings(tmp_path):
    """The comparison is fair only if nothing but the trainer differs: every MInTRL field and the optimiser, batch,
    sampling and step settings are equal across the arms; only the staleness bound and the server fields differ."""
    args = {arm: learning_async.arm_args(arm, "http://127.0.0.1:1", tmp_path, 48, 0, 8) for arm in learning_async.ARMS}
    shared = [f.name for f in dataclasses.fields(MInTRLFields)] + [
        "learning_rate", "lr_scheduler_type", "max_grad_norm", "per_device_train_batch_size",
        "gradient_accumulation_steps", "max_steps", "seed", "temperature", "top_p", "top_k", "max_completion_length",
        "num_generations", "reward_weights", "mask_truncated_completions",
    ]  # fmt: skip
    sync = args["sync"]
    assert sync.anchor == "const" and sync.num_generations == 8 and sync.per_device_train_batch_size == 64
    assert sync.intervention_steps == 19 and not sync.shuffle_dataset and sync.beta == 0.0
    for arm in ("async-s1", "async-s2"):
        differing = {name for name in shared if getattr(args[arm], name, None) != getattr(sync, name, None)}
        assert not differing, (arm, {n: (getattr(args[arm], n, None), getattr(sync, n, None)) for n in differing})
    assert (args["async-s1"].max_staleness, args["async-s2"].max_staleness) == (1, 2)


def run_record(arm: str, seed: int, pass1: float, pass8: float, staleness: dict | None) -> dict:
    logs = [{"step": step, "reward": 0.1 * step, "mintrl/judge_token_frac": 0.2} for step in (1, 2, 20, 21)]
    return {
        "arm": arm,
        "seed": seed,
        "max_staleness": learning_async.ARMS[arm],
        "final": {"pass@1": pass1, "pass@8": pass8},
        "train_seconds": 120.0,
        "staleness": staleness,
        "logs": logs,
    }


def test_the_report_pairs_each_async_run_with_the_sync_run_of_its_seed():
    runs = [
        run_record("sync", 0, 0.10, 0.30, None),
        run_record("sync", 1, 0.20, 0.40, None),
        run_record("async-s1", 0, 0.12, 0.33, {"0": 64, "1": 3008}),
        run_record("async-s1", 1, 0.24, 0.43, {"1": 3072}),
        run_record("async-s2", 1, 0.14, 0.40, {"1": 1000, "2": 3000}),  # seed 0 missing: paired over seed 1 only
    ]
    saved = {
        "provenance": {"command": "python -m benchmarks.studies.learning_async", "commit": "0" * 40, "dirty": False},
        "settings": {**learning_async.MODES["full"], "mode": "full", "arms": list(learning_async.ARMS)},
        "runs": runs,
    }
    text = learning_async.render(saved)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    # async-s1 - sync per seed: pass@1 +2 and +4 points (mean +3), pass@8 +3 and +3
    assert rows["async-s1"][4].startswith("+3.0 [") and rows["async-s1"][5].startswith("+3.0 [")
    assert rows["async-s2"][4] == "-6.0" and rows["async-s2"][5] == "+0.0"  # one shared seed: no interval
    assert rows["sync"][4] == "-" and "0 (by construction)" in rows["sync"][6]
    assert rows["async-s1"][6] == "0: 1%, 1: 99%" and rows["async-s2"][6] == "1: 25%, 2: 75%"
    # intervention phase of 48 steps: steps <= 19 (rewards 0.1, 0.2), after it steps 20, 21 (2.0, 2.1)
    assert rows["sync"][7] == "0.150 / 2.050"
    assert "| 0 | 10.0 / 30.0 | 12.0 / 33.0 | - |" in text
