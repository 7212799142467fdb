"""MInTRL under 2-process CPU DDP (torchrun, gloo): roles, gathered rewards and sliced advantages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_two_process_ddp_baselines_cross_processes(tiny_model_path, tmp_path):
    script = Path(__file__).with_name("mintrl_ddp_script.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        tiny_model_path,
        str(tmp_path),
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world"] == 2 and r["steps"] == 2 for r in ranks)
    for step in range(len(ranks[0]["records"])):
        rewards = ranks[0]["records"][step]["rewards"]
        assert rewards == ranks[1]["records"][step]["rewards"]  # gathered: identical on both ranks
        advantages, judge_rows = [], []
        for r in ranks:  # rank 0 holds global rows 0-1 (controls), rank 1 rows 2-3 (intervened) of each group
            advantages += r["records"][step]["advantages"]
            judge_rows += r["records"][step]["judge_rows"]
        assert len(rewards) == 4 and judge_rows == [False, False, True, True]
        baseline = (rewards[0] + rewards[1]) / 2
        assert advantages == pytest.approx([x - baseline for x in rewards], abs=1e-6)
        assert rewards[2:] == [1.0, 1.0]
