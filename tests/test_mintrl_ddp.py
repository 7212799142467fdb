"""MInTRL under 2-process CPU DDP (torchrun, gloo): roles, gathered rewards and sliced advantages."""

import pytest
from conftest import run_on_two_processes


@pytest.mark.slow
def test_two_process_ddp_baselines_cross_processes(tiny_model_path, tmp_path):
    ranks = run_on_two_processes("mintrl_ddp_script.py", tiny_model_path, str(tmp_path), out=tmp_path)
    assert all(r["world"] == 2 and r["steps"] == 2 for r in ranks)
    # rank 0 holds only controls, yet its absorption watch sums the judge tokens of both ranks: the same decisions
    assert ranks[0]["absorption"] == ranks[1]["absorption"] and len(ranks[0]["absorption"]["nll"]) == 1
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
