"""benchmarks/studies/cost_async.py without a server: the per-round pairing, the report computed from the JSON alone, the
staleness bookkeeping against TRL's one-batch-ahead collation (benchmarks/lib/server_training.py), and the process
accounting (benchmarks/lib/vllm_server.py)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from benchmarks.lib import server_training, vllm_server
from benchmarks.lib.rollout_cost import ROLLOUT_SHAPE
from benchmarks.lib.stats import mean_interval
from benchmarks.lib.step_cost import turn_order
from benchmarks.studies import cost_async
from benchmarks.tasks.toy.cost_async_arms import ARMS


def saved_result(sps: dict[str, list[float]], pairs: list[str]) -> dict:
    """A cost_async.json content with the given steps per second per arm and round."""
    arms = list(sps)
    rounds = len(next(iter(sps.values())))
    runs = []
    for r in range(rounds):
        for position, i in enumerate(turn_order(len(arms), r)):
            arm = arms[i]
            synchronous = ARMS[arm][1]
            runs.append(
                {
                    "arm": arm,
                    "round": r,
                    "position": position,
                    "steps_per_second": sps[arm][r],
                    "window_seconds": 2 / sps[arm][r],
                    "trainer_cpu_seconds": 2.0,
                    "server_cpu_seconds": 12.0,
                    "first_step_seconds": 20.0,
                    "staleness": None if synchronous else {"1": 30, "2": 2},
                    "logs": [{"step": 2, "completions/mean_length": 90.0, "sample/dropped_stale_total": 3.0}],
                }
            )
    return {
        "provenance": {
            "command": "python -m benchmarks.studies.cost_async",
            "commit": "0" * 40,
            "changed_files_that_matter": [],
        },
        "settings": {
            "rounds": rounds,
            "warmup": 1,
            "steps": 2,
            "pairs": pairs,
            "arms": arms,
            "shape": dict(ROLLOUT_SHAPE),
            "delay_fraction": 0.1,
        },  # fmt: skip
        "wall_seconds": 60.0,
        "result": {
            "runs": runs,
            "full_length_seconds": 10.0,
            "judge_delay_s": 1.0,
            "stop_tokens": 3,
            "server_command": "python vllm_cli.py serve model",
        },  # fmt: skip
    }


def test_the_ratio_is_paired_within_each_round_and_the_report_is_computed_from_the_json():
    sps = {
        "mintrl_async": [0.2, 0.3, 0.1],
        "mintrl_sync": [0.1, 0.2, 0.1],
        "grpo_async": [0.4, 0.4, 0.4],
        "grpo_sync": [0.2, 0.4, 0.2],
    }
    saved = saved_result(sps, ["mintrl", "grpo"])
    stats = cost_async.pair_stats(saved["result"]["runs"], "mintrl")
    assert stats["ratios"] == pytest.approx([2.0, 1.5, 1.0])  # per round, not a ratio of means
    interval = mean_interval([2.0, 1.5, 1.0])
    text = cost_async.render(saved)
    row = next(line for line in text.splitlines() if line.startswith(f"| {cost_async.PAIR_LABELS['mintrl']} |"))
    assert f"| {interval.mean:.2f} [{interval.low:.2f}, {interval.high:.2f}] |" in row
    assert "1: 94%, 2: 6%" in row  # trained staleness of the async arm
    grpo = next(line for line in text.splitlines() if line.startswith(f"| {cost_async.PAIR_LABELS['grpo']} |"))
    assert "| 1.67 [" in grpo
    # stale rollouts dropped per timed step: TRL logs each interval's count (3 per run here; 3 runs x 2 timed steps)
    arm_row = next(line for line in text.splitlines() if line.startswith("| grpo_async |"))
    assert arm_row.endswith("| 1.5 |")
    # per-round table: every round, in its Williams order, with both ratios
    assert "| 2 | " in text and "| 3 | " in text
    block = cost_async.readme_block(saved).splitlines()
    assert [line.split(" | ")[1] for line in block if line.startswith(("| MInTRL", "| GRPO"))] == [
        row.split(" | ")[1],
        grpo.split(" | ")[1],
    ]


def test_the_report_shows_the_servers_work_and_the_machine_it_ran_on():
    """The server's counters and each server process's CPU per timed step (window differences of what the run
    recorded at the window's ends), beside the completion tokens trained, and the machine's conditions."""
    assert vllm_server.window_delta({"a": 1.0}, {"a": 9.0, "b": 4.0}, per=2) == {"a": 4.0, "b": 2.0}
    saved = saved_result({"mintrl_async_s2": [0.2, 0.3], "mintrl_sync": [0.1, 0.2]}, ["mintrl_s2"])
    for run in saved["result"]["runs"]:
        run["server_counters_per_step"] = {
            "vllm:prompt_tokens_total": 400.0,
            "vllm:prefix_cache_hits_total": 300.0,
            "vllm:generation_tokens_total": 3500.0 if run["arm"] == "mintrl_async_s2" else 3000.0,
            "vllm:request_success_total": 70.0,
            "vllm:num_preemptions_total": 0.5,
        }
        run["server_cpu_by_process_per_step"] = {"VLLM::EngineCor": 6.0, "VLLM::Worker": 8.0, "python": 0.004}
    saved["machine"] = {"cpu_model": "Test CPU", "logical_cpus": 2, "usable_cpus": 2, "load_before": 0.5,
                        "load_during_mean": 2.0, "load_during_max": 3.0}  # fmt: skip
    text = cost_async.render(saved)
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| mintrl_")}
    # 90 tokens mean length x 32 rollouts trained; processes under 0.01 s are left out
    assert (
        "| 400 | 300 | 3500 | 2880 | 70 | 0.5 | VLLM::EngineCor 6.00, VLLM::Worker 8.00 |" in rows["| mintrl_async_s2"]
    )
    assert "| 3000 | 2880 |" in rows["| mintrl_sync"]
    assert "Machine: Test CPU, 2 of 2 CPUs usable; 1-minute load 0.50 before, 2.00 mean / 3.00 max during" in text
    assert "Test CPU" in cost_async.readme_block(saved)


class FakeCollator:
    def torch_call(self, examples):
        return {"collated": len(examples[0])}


def test_staleness_is_counted_against_the_weights_that_train_each_collated_batch():
    """The collator runs one micro-batch ahead of the loss (accelerate's dispatcher): each loss pops the oldest
    collated batch and compares its samples' versions with the trainer's version at that moment."""
    trainer = SimpleNamespace(rollout_queue=queue.Queue(), model_version=1, state=SimpleNamespace(global_step=0))
    trainer.compute_loss = lambda model, inputs, **kwargs: "loss"
    recorder = server_training.StalenessRecorder(trainer, FakeCollator)

    def push(version: int) -> dict:
        sample = SimpleNamespace(metrics={"reward": 0.0}, model_version=version)
        trainer.rollout_queue.put(sample)
        got = trainer.rollout_queue.get(timeout=1)
        return {"metrics": got.metrics}  # what TRL's dataset yields: the same metrics object

    collator = FakeCollator()
    with recorder.collating():
        for versions in ([1, 1], [1, 1]):  # step 0's batch and, prefetched, step 1's
            collator.torch_call([[SimpleNamespace(samples=[push(v) for v in versions])]])
        assert trainer.compute_loss(None, {}) == "loss"  # step 0 trains with version 1
        trainer.model_version, trainer.state.global_step = 2, 1
        collator.torch_call([[SimpleNamespace(samples=[push(2), push(1)])]])  # step 2's, written during step 0
        trainer.compute_loss(None, {})
        trainer.model_version, trainer.state.global_step = 3, 2
        trainer.compute_loss(None, {})
    assert FakeCollator.torch_call is not None and "recording" not in FakeCollator.torch_call.__name__
    assert [r["staleness"] for r in recorder.per_step] == [[0, 0], [1, 1], [1, 2]]
    assert not recorder.pending and not recorder.collated


def test_cpu_accounting_sees_child_processes():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while child.pid not in vllm_server.descendants(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in vllm_server.descendants(os.getpid())
        assert child.pid in vllm_server.leftover_children(None)
        assert child.pid not in vllm_server.leftover_children(child.pid)  # the "server" is excepted
        ours, server = vllm_server.cpu_seconds(child.pid)
        assert ours > 0 and server >= 0
    finally:
        child.kill()
        child.wait()
